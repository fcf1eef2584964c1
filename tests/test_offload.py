"""Offloaded decoder layers (asr.models.offload): the same logits and words as the model in memory, on a tiny random
Whisper; placement under --max-memory; auto's choice; and the one-line errors of the command line."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from asr.assist.assistants import SharedEncoderAssistant
from asr.assist.choose import OFFLOAD_SCHEDULE, make_assistant
from asr.cli import main
from asr.transcription import transcribe
from asr.models.offload import (
    OffloadError,
    OffloadOptions,
    offload_store,
    parse_size,
    plan_placement,
)
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.whisper.decoder import WhisperDecoderAdapter
from tests.test_ct2 import tiny_whisper
from tests.test_registry import save_processor

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def in_memory(tiny_whisper_folder: Path):
    # An offloaded model keeps no packed copy of its output head (it is short of memory); without it the model
    # in memory runs the same kernels, and the two agree bit for bit.
    bundle = load_model(str(tiny_whisper_folder))
    bundle.model.get_output_embeddings().packed = None
    return bundle


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """40 s of noise: two windows, so the second is conditioned on the first's text."""
    return np.random.default_rng(0).normal(0, 0.1, 40 * 16000).astype(np.float32)


def _logits(model: torch.nn.Module, encoder_output: torch.Tensor, native: bool = True) -> list[torch.Tensor]:
    """A prefill, one-token steps, a rollback and a five-token check, as assisted decoding runs them; without the
    `native` step (`decoding.kernels.native_step`, which an offloaded decoder cannot use) a model in memory runs its
    steps layer by layer, through the kernels an offloaded one runs."""
    adapter = WhisperDecoderAdapter(model, encoder_output)
    if not native:
        adapter._native_step = False
    cache = adapter.new_cache(1)
    ids = torch.tensor([[50258, 50259, 50359, 400, 401, 402, 403, 404, 405]])
    out = [adapter.forward(ids[:, :3], cache, 3)]
    out += [adapter.forward(ids[:, t:t + 1], cache, 1) for t in range(3, 6)]
    adapter.crop(cache, 4)
    out.append(adapter.forward(ids[:, 4:9], cache, 5))
    return out


@pytest.mark.parametrize("reader", ["read", "mmap", "accelerate"])
@pytest.mark.parametrize("prefetch", [True, False])
def test_offloaded_logits_are_the_in_memory_logits_bit_for_bit(tiny_whisper_folder: Path, in_memory, reader: str,
                                                               prefetch: bool) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk", reader=reader, prefetch=prefetch))
    store = offload_store(offloaded.model)
    assert store is not None and sorted(store.layers) == [0, 1]
    assert all(p.is_meta for p in offloaded.model.get_decoder().layers[0].parameters())
    encoder_output = torch.randn(1, 1500, 64)
    expected_logits = _logits(in_memory.model, encoder_output, native=False)
    for got, expected in zip(_logits(offloaded.model, encoder_output), expected_logits):
        assert torch.equal(got, expected)


def test_an_offloaded_model_has_no_packed_head_and_the_same_tokens(tiny_whisper_folder: Path) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk"))
    packed = load_model(str(tiny_whisper_folder))
    assert offloaded.model.get_output_embeddings().packed is None
    assert packed.model.get_output_embeddings().packed is not None
    encoder_output = torch.randn(1, 1500, 64)
    for got, expected in zip(_logits(offloaded.model, encoder_output), _logits(packed.model, encoder_output)):
        assert torch.allclose(got, expected, atol=1e-5) and torch.equal(got.argmax(-1), expected.argmax(-1))


def test_the_cpu_memory_store_a_gpu_uses_gives_the_same_logits(tiny_whisper_folder: Path, in_memory) -> None:
    # `--offload cpu` runs on a GPU only; its store (layers kept in memory, copied per pass) runs here on the CPU.
    from transformers import WhisperConfig

    from asr.models.offload import load_offloaded
    from decoding.kernels.products import use_cpu_kernels

    model = load_offloaded(tiny_whisper_folder, WhisperConfig.from_pretrained(tiny_whisper_folder), OffloadOptions("cpu"), "cpu",
                           torch.float32)
    use_cpu_kernels(model, pack_head=False)  # as load_model does for an offloaded model on a CPU
    assert offload_store(model).folder is None
    encoder_output = torch.randn(1, 1500, 64)
    for got, expected in zip(_logits(model, encoder_output), _logits(in_memory.model, encoder_output, native=False)):
        assert torch.equal(got, expected)


def test_max_memory_alone_offloads_to_the_next_tier() -> None:
    from asr.models.offload import resolve_offload

    assert resolve_offload(OffloadOptions(max_memory=10**9), "cpu").device == "disk"
    assert resolve_offload(OffloadOptions(), "cpu") is None
    with pytest.raises(ValueError, match="not supported with --device mps"):
        resolve_offload(OffloadOptions("disk"), "mps")


def test_module_forward_works_through_accelerate_hooks(tiny_whisper_folder: Path, in_memory) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk"))
    ids, states = torch.tensor([[50258, 50259, 50359, 400]]), torch.randn(1, 1500, 64)
    with torch.inference_mode():
        got = offloaded.model.get_decoder()(input_ids=ids, encoder_hidden_states=states).last_hidden_state
        expected = in_memory.model.get_decoder()(input_ids=ids, encoder_hidden_states=states).last_hidden_state
    assert torch.equal(got, expected)
    # The hooks send the weights back to disk after the call.
    assert all(p.is_meta for p in offloaded.model.get_decoder().layers[1].parameters())


@pytest.mark.parametrize("assistant", ["none", "self:int8", "self"])
def test_offloaded_transcripts_equal_in_memory_ones(tiny_whisper_folder: Path, in_memory, noise: np.ndarray,
                                                   assistant: str) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk"))
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40)
    expected = transcribe(in_memory, noise, options, make_assistant(assistant, in_memory))
    got = transcribe(offloaded, noise, options, make_assistant(assistant, offloaded))
    assert [s.tokens for s in got.segments] == [s.tokens for s in expected.segments]
    assert got.text == expected.text and got.stats.windows == expected.stats.windows == 2
    if assistant != "none":
        assert got.stats.generation.drafted_tokens > 0


def test_max_memory_keeps_the_first_layers_that_fit(tmp_path: Path, noise: np.ndarray) -> None:
    from transformers import WhisperForConditionalGeneration

    config = tiny_whisper().config
    config.decoder_layers = 4
    torch.manual_seed(4)
    WhisperForConditionalGeneration(config).save_pretrained(tmp_path)
    save_processor(tmp_path)
    in_memory = load_model(str(tmp_path))
    placement = plan_placement(in_memory.model, OffloadOptions(max_memory=10**12), torch.float32)
    assert placement.offloaded == ()
    layer = sum(p.numel() for p in in_memory.model.get_decoder().layers[0].parameters()) * 4
    resident = placement.resident_bytes - 4 * layer
    one_kept = OffloadOptions(max_memory=resident + 3 * layer)  # the resident parts, two read buffers, one layer
    assert plan_placement(in_memory.model, one_kept, torch.float32).offloaded == (1, 2, 3)
    with pytest.raises(OffloadError, match="cannot hold the model's resident parts"):
        plan_placement(in_memory.model, OffloadOptions(max_memory=resident + layer), torch.float32)
    partly = load_model(str(tmp_path), offload=one_kept)
    assert sorted(offload_store(partly.model).layers) == [1, 2, 3]
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40)
    expected = transcribe(in_memory, noise, options, make_assistant("self:int8", in_memory))
    got = transcribe(partly, noise, options, make_assistant("self:int8", partly))
    assert got.text == expected.text


def test_auto_drafts_many_tokens_with_a_resident_copy_for_an_offloaded_model(tiny_whisper_folder: Path, in_memory) -> None:
    import asr.assist.choose

    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk"))
    assistant = make_assistant("auto", offloaded)
    assert isinstance(assistant, SharedEncoderAssistant) and assistant.name == "self:int8"
    assert assistant.schedule == OFFLOAD_SCHEDULE and assistant.for_streams  # a stream drafts with it too
    assert TranscribeOptions().drafting(assistant.schedule) == OFFLOAD_SCHEDULE
    assert TranscribeOptions(num_assistant_tokens=3).drafting(assistant.schedule) == ("constant", 3)
    assert make_assistant("auto", in_memory) is None  # in memory, nothing pays for a small model on a CPU
    assert asr.assist.choose.offload_assistants(offloaded.source, "cuda") == []


def test_layer_files_go_with_the_model(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk", folder=str(tmp_path)))
    [own] = list(tmp_path.iterdir())
    assert sorted(p.name for p in own.iterdir()) == ["layer_0.safetensors", "layer_1.safetensors"]
    offload_store(offloaded.model).close()
    del offloaded
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def _mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose memory map holds `tensor`'s data, from /proc/self/maps; None for anonymous memory."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, _, _, _, inode, *path = line.split()
        low, high = (int(x, 16) for x in span.split("-"))
        if low <= address < high:
            return path[0] if path and inode != "0" else None
    return None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resident_weights_of_a_model_offloaded_on_a_cpu_stay_file_backed(tiny_whisper_folder: Path, tmp_path: Path,
                                                                         dtype: torch.dtype) -> None:
    # A memory limit can drop and re-read file pages, not anonymous memory: the encoder, embeddings and head are
    # views of the checkpoint's map, or (converted to another dtype) of a file in the offload folder.
    offloaded = load_model(str(tiny_whisper_folder), dtype=dtype, offload=OffloadOptions("disk", folder=str(tmp_path)))
    model = offloaded.model
    resident = [model.get_encoder().layers[0].fc1.weight, model.get_decoder().embed_tokens.weight,
                model.get_encoder().conv1.weight, model.get_decoder().layer_norm.weight]
    assert all(t.dtype == dtype for t in resident)
    expected = tiny_whisper_folder / "model.safetensors" if dtype == torch.float32 else \
        next(tmp_path.iterdir()) / "resident.safetensors"
    assert {_mapped_file(t) for t in resident} == {str(expected.resolve())}
    assert model.get_output_embeddings().weight.data_ptr() == model.get_decoder().embed_tokens.weight.data_ptr()


def test_a_bfloat16_offloaded_model_is_the_bfloat16_model(tiny_whisper_folder: Path) -> None:
    in_memory = load_model(str(tiny_whisper_folder), dtype=torch.bfloat16).model
    offloaded = load_model(str(tiny_whisper_folder), dtype=torch.bfloat16, offload=OffloadOptions("disk")).model
    assert {p.dtype for p in offloaded.parameters() if not p.is_meta} == {torch.bfloat16}
    expected = dict(in_memory.named_parameters())
    for name, parameter in offloaded.named_parameters():
        if not parameter.is_meta:
            assert torch.equal(parameter, expected[name]), name
    # It runs over its mapped weights (the in-memory bfloat16 model packs its decoder: other kernels, so close).
    encoder_output = torch.randn(1, 1500, 64, dtype=torch.bfloat16)
    for got, want in zip(_logits(offloaded, encoder_output), _logits(in_memory, encoder_output)):
        torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("groups, file, content, expected", [
    ("0::/box\n", "box/memory.max", "629145600\n", 629145600),
    ("0::/box\n", "box/memory.max", "max\n", None),
    ("12:cpu:/x\n5:memory:/box\n", "memory/box/memory.limit_in_bytes", "734003200\n", 734003200),
    ("5:memory:/box\n", "memory/box/memory.limit_in_bytes", "9223372036854771712\n", None),  # v1's "no limit"
    ("5:memory:/box\n", "elsewhere", "1", None),
    ("garbled\n0::/box\n", "box/memory.max", "629145600\n", 629145600),  # a line it cannot read is passed over
])
def test_the_cgroup_memory_limit_is_read_from_v1_and_v2(tmp_path: Path, groups: str, file: str, content: str,
                                                         expected: int | None) -> None:
    from asr.models.offload import memory_limit

    (tmp_path / "cgroup").write_text(groups)
    (tmp_path / "fs" / file).parent.mkdir(parents=True)
    (tmp_path / "fs" / file).write_text(content)
    assert memory_limit(tmp_path / "cgroup", tmp_path / "fs") == expected


def test_sizes_parse_like_accelerates() -> None:
    assert parse_size("300MB") == 300 * 10**6
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("4096") == 4096
    for text in ("lots", "infGB", "1e400GB", "nanGB", "-5GB", "0"):
        with pytest.raises(ValueError, match="expected a size such as 300MB"):
            parse_size(text)


def _run(*args: str):
    return CliRunner().invoke(main, ["transcribe", *args])


@pytest.fixture(scope="module")
def noise_file(tmp_path_factory: pytest.TempPathFactory, noise: np.ndarray) -> Path:
    import soundfile

    path = tmp_path_factory.mktemp("audio") / "noise.wav"
    soundfile.write(path, noise[: 8 * 16000], 16000)
    return path


def test_transcribe_command_offloads_with_the_same_text(tiny_whisper_folder: Path, noise_file: Path) -> None:
    common = [str(noise_file), "--model", str(tiny_whisper_folder), "--language", "en", "--temperature", "0", "-q"]
    plain = _run(*common)
    offloaded = _run(*common, "--offload", "disk", "--assistant", "auto")
    assert plain.exit_code == 0 and offloaded.exit_code == 0, offloaded.output
    assert offloaded.output == plain.output


@pytest.mark.parametrize("args, message", [
    (["--max-memory", "1MB"], "--max-memory 1MB cannot hold the model's resident parts"),
    (["--offload", "cpu", "--device", "cpu"], "--offload cpu keeps layers in CPU memory for a model on a GPU"),
    (["--max-memory", "lots"], "expected a size such as 300MB or 2GiB, got 'lots'"),
    (["--offload-folder", "{audio}/layers", "--offload", "disk"], "cannot write to offload folder"),  # under a file
    (["--offload-folder", "somewhere"], "--offload-folder needs --offload disk"),
])
def test_bad_offload_options_fail_in_one_line(tiny_whisper_folder: Path, noise_file: Path, args: list[str],
                                              message: str) -> None:
    args = [a.format(audio=noise_file) for a in args]
    result = _run(str(noise_file), "--model", str(tiny_whisper_folder), "--device", "cpu", *args)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in result.output


@pytest.fixture(scope="module")
def terse_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Whisper whose decoder always ranks end-of-text first: a window ends after a timestamp or
    two, however many temperatures the commands' fallback would try (the plumbing tests need no long text)."""
    model = tiny_whisper(seed=5)
    decoder = model.get_decoder()
    with torch.no_grad():
        decoder.layer_norm.weight.zero_()
        decoder.layer_norm.bias.copy_(1000 * decoder.embed_tokens.weight[50257])
    folder = tmp_path_factory.mktemp("terse-whisper")
    model.save_pretrained(folder)
    save_processor(folder)
    return folder


def test_batch_and_eval_commands_take_the_offload_options(terse_folder: Path, noise_file: Path,
                                                          tmp_path: Path) -> None:
    import json
    import shutil

    folder = tmp_path / "audio"
    folder.mkdir()
    shutil.copy(noise_file, folder / "noise.wav")
    common = ["--model", str(terse_folder), "--language", "en", "--threads", "1", "-q"]
    runner = CliRunner()
    rows = {}
    for name, extra in (("plain", []), ("offloaded", ["--offload", "disk", "--assistant", "auto"])):
        result = runner.invoke(main, ["batch", str(folder), "-o", str(tmp_path / f"{name}.jsonl"), *common, *extra])
        assert result.exit_code == 0, result.output
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows["offloaded"]] == [r["text"] for r in rows["plain"]]
    assert [r["error"] for r in rows["offloaded"]] == [None]
    report = tmp_path / "report"
    result = runner.invoke(main, ["eval", str(folder), "--report", str(report), "--compare", "greedy",
                                  "--compare", "assisted:auto", "--max-memory", "100GB", *common])
    assert result.exit_code == 0, result.output
    run = json.loads((report / "report.json").read_text())["run"]
    assert run["offload"] == {"device": "disk", "max_memory": 100 * 10**9}
    result = runner.invoke(main, ["eval", str(folder), "--report", str(report), "--max-memory", "1MB", *common])
    assert result.exit_code != 0 and "cannot hold the model's resident parts" in result.output


def test_a_trained_draft_drafts_for_the_offloaded_model(tiny_whisper_folder: Path, in_memory, noise: np.ndarray,
                                                        tmp_path: Path) -> None:
    from asr.assist.draft_model import DraftDecoder, save_draft

    draft = DraftDecoder(in_memory.model, [1])
    draft.restrict_vocabulary(torch.arange(0, 50000, 7))
    save_draft(draft, in_memory.model, tmp_path / "tiny-draft", model_name=in_memory.name, training={})
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk"))
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40)
    for spec in ("{}", "{}:int8"):
        name = spec.format(tmp_path / "tiny-draft")
        expected = transcribe(in_memory, noise, options, make_assistant(name, in_memory))
        got = transcribe(offloaded, noise, options, make_assistant(name, offloaded))
        assert got.text == expected.text
        assert got.stats.generation.accepted_tokens == expected.stats.generation.accepted_tokens


def test_asr_eval_offloads_the_model_in_every_precision_it_compares(tiny_whisper_folder: Path) -> None:
    from eval.backends import make_backends
    from eval.configs import parse_config

    offload = OffloadOptions("disk")
    bundle = load_model(str(tiny_whisper_folder), offload=offload)
    configs = [parse_config("greedy"), parse_config("greedy,dtype=bfloat16")]
    backends, skipped = make_backends(configs, str(tiny_whisper_folder), bundle, device="cpu", dtype=torch.float32,
                                      threads=1, offload=offload)
    assert not skipped and backends[0].bundle is bundle
    assert all(offload_store(b.bundle.model) is not None for b in backends)  # the bfloat16 model too
