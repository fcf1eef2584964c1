"""Model precisions (`--dtype`): the int8 model, exact assisted decoding over it, and the refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from asr.cli import main
from asr.models.precision import INT8, int8_activations, resolve_precision
from asr.whisper.decoder import WhisperDecoderAdapter
from decoding.kernels.int8 import Int8Linear
from decoding.kernels.products import WidenedLinear
from tests.conftest import REPO, evaldata

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def test_precision_names_resolve_by_device(monkeypatch) -> None:
    assert resolve_precision("auto", "cpu") == torch.float32
    assert resolve_precision("auto", "cuda") == torch.float16
    assert resolve_precision("int8", "cpu") == INT8
    assert resolve_precision("bfloat16", "cuda") == torch.bfloat16
    with pytest.raises(ValueError, match="int8 runs on the CPU only"):
        resolve_precision("int8", "cuda")
    with pytest.raises(ValueError, match="float16 is for GPUs"):
        resolve_precision("float16", "cpu")
    monkeypatch.setattr("asr.models.precision.native_bfloat16", lambda: False)
    with pytest.raises(ValueError, match="no native bfloat16"):
        resolve_precision("bfloat16", "cpu")


def test_a_precision_this_machine_cannot_run_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setattr("asr.models.precision.native_bfloat16", lambda: False)
    clip = str(sorted(SAMPLES.glob("*.flac"))[0])
    for args in (["--dtype", "bfloat16", "--device", "cpu"], ["--dtype", "float16", "--device", "cpu"]):
        result = CliRunner().invoke(main, ["transcribe", clip, *args])
        assert result.exit_code == 2 and "--dtype" in result.output and "Traceback" not in result.output
        assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1


def test_int8_with_offloading_is_a_one_line_error(tiny_whisper_folder: Path) -> None:
    clip = str(sorted(SAMPLES.glob("*.flac"))[0])
    result = CliRunner().invoke(main, ["transcribe", clip, "--model", str(tiny_whisper_folder), "--dtype", "int8",
                                       "--offload", "disk"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == "Error: int8 models run on the CPU, without --offload"


@pytest.fixture(scope="module")
def tiny_int8(tiny_whisper_folder: Path):
    from asr.models.registry import load_model

    return load_model(str(tiny_whisper_folder), dtype=INT8)


# The precisions whose assisted decoding is bit-exact on a CPU (bfloat16's packed products are not
# row-independent for every row count: `asr.models.precision.pack_decoder`).
EXACT = ["int8"]


def test_the_int8_model_has_int8_decoder_products_and_a_bfloat16_encoder(tiny_int8) -> None:
    model = tiny_int8.model
    head = model.get_output_embeddings()
    if int8_activations() == torch.float32:
        # The head is the bfloat16 token table itself (tied: one tensor), multiplied in float32.
        assert isinstance(head, WidenedLinear) and head.weight is model.get_decoder().embed_tokens.weight
        assert head.weight.dtype == torch.bfloat16
    else:
        assert isinstance(head, Int8Linear)
    assert all(isinstance(layer.fc1, Int8Linear) and isinstance(layer.self_attn.q_proj, Int8Linear)
               for layer in model.get_decoder().layers)
    assert {p.dtype for p in model.get_encoder().parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("precision", EXACT)
def test_a_row_has_the_same_logits_in_a_step_and_in_a_check_of_drafts(tiny_whisper_folder: Path,
                                                                       precision: str) -> None:
    """What makes assisted decoding over the int8 model exact: checking k drafts in one pass gives each row the
    bits a one-token step gives it (row-independent products, attention over fixed slots, the transposed
    weighted sums)."""
    from asr.models.registry import load_model

    model = load_model(str(tiny_whisper_folder), dtype=resolve_precision(precision, "cpu")).model
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        encoder_output = torch.randn(1, 1500, model.config.d_model, generator=g)
        decoder = WhisperDecoderAdapter(model, encoder_output)
        cache = decoder.new_cache(1)
        ids = torch.randint(0, 50000, (1, 14), generator=g)
        decoder.forward(ids[:, :4], cache, 1)
        steps = torch.cat([decoder.forward(ids[:, i:i + 1], cache, 1) for i in range(4, 14)], dim=1)
        for width in (2, 5, 10):
            decoder.crop(cache, 4)
            check = decoder.forward(ids[:, 4:4 + width], cache, width)
            assert torch.equal(check, steps[:, :width]), f"seed {seed} width {width}"


def test_int8_base_transcribes_like_float32_and_its_draft_keeps_its_words(base) -> None:
    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from audio import load_audio
    from eval.wer import word_error_rate

    int8 = load_model("base", dtype=INT8)
    audio = load_audio(evaldata("longform", "voxpopuli-en-000.ogg"))
    options = TranscribeOptions(language="en")
    reference = transcribe(base, audio, options)
    plain = transcribe(int8, audio, options)
    assert word_error_rate([reference.text], [plain.text]) < 0.05
    for spec in ("base-draft:int8", "self:bf16"):
        assisted = transcribe(int8, audio, options, make_assistant(spec, int8))
        assert [s.tokens for s in assisted.segments] == [s.tokens for s in plain.segments], spec
        assert assisted.stats.generation.accepted_tokens > 0


def test_asr_models_says_which_precisions_this_cpu_runs(monkeypatch) -> None:
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0 and "base" in result.output
    assert "--dtype on this machine's CPU: float32" in result.output and "int8" in result.output
    monkeypatch.setattr("asr.models.precision.native_bfloat16", lambda: False)
    result = CliRunner().invoke(main, ["models"])
    assert "float32, int8 (auto: float32)" in result.output


_SHAPES = """
import os, sys
from pathlib import Path
import torch
from decoding.kernels.products import limit_kernel_caches
if sys.argv[1] == "bounded":
    limit_kernel_caches()
def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
def products(first, count):
    for n in range(first, first + count):  # attention products of a new shape each time, as decoding meets them
        torch.randn(8, 1 + n % 11, 64, dtype=torch.bfloat16) @ torch.randn(8, 64, n, dtype=torch.bfloat16)
with torch.inference_mode():
    products(1, 100)
    start = rss()
    products(101, 300)
print(rss() - start)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc (Linux)")
def test_kernel_caches_are_bounded_so_new_shapes_do_not_grow_memory() -> None:
    def growth(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _SHAPES, mode], check=True, capture_output=True, text=True,
                             cwd=REPO, env={k: v for k, v in os.environ.items() if not k.endswith("CACHE_CAPACITY")})
        return float(out.stdout.split()[-1])

    bounded = growth("bounded")  # the default caches grow by ~200 MB here
    assert bounded < 60, f"{bounded:.0f} MB for 300 new product shapes with bounded kernel caches"


def test_the_command_line_bounds_the_kernel_caches(monkeypatch) -> None:
    from asr.cli.runtime import setup_runtime
    from decoding.kernels.products import KERNEL_CACHE_CAPACITY

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    setup_runtime("cpu", "float32", None)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == os.environ["LRU_CACHE_CAPACITY"] == str(KERNEL_CACHE_CAPACITY)


def test_a_float32_decoder_is_packed_for_passes_of_several_rows_with_the_same_words(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Assisted (or batched) decoding packs a small float32 decoder's layers (`pack_for_rows`); the words stay
    the dense decoder's, and a decoder over the size limit is left dense."""
    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe
    from asr.models.precision import pack_for_rows
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from audio.load import load_audio
    from decoding.kernels.products import OneDnnLinear
    from tests.conftest import tiny_whisper_in

    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    audio = load_audio(str(sorted(SAMPLES.glob("*.flac"))[0]))
    options = TranscribeOptions(temperatures=(0.0,))
    dense = load_model(str(folder))
    expected = transcribe(dense, audio, options)
    linears = [m for m in dense.model.get_decoder().layers.modules() if isinstance(m, OneDnnLinear)]
    assert linears and all(m.packed is None for m in linears)  # plain greedy: one row a pass, left dense
    monkeypatch.setattr("asr.models.precision.PACK_FOR_ROWS_LIMIT", 0)
    assert not pack_for_rows(dense.model)
    monkeypatch.undo()
    packed = load_model(str(folder))
    assisted = transcribe(packed, audio, options, make_assistant("self:int8", packed))
    assert all(m.packed is not None for m in packed.model.get_decoder().layers.modules()
               if isinstance(m, OneDnnLinear))
    assert assisted.text == expected.text
    assert transcribe(packed, audio, options).text == expected.text
