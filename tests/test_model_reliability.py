"""Model files under misuse: bit rot in the cache, a read-only cache, folders newer transformers write, and
damaged configuration files. Each case builds its own tiny model; none needs downloaded weights."""

from __future__ import annotations

import gc
import json
import logging
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from asr.cli import main
from asr.models import cache
from asr.models.ct2 import ModelFileError
from asr.models.registry import cache_dir, load_model
from tests.conftest import SAMPLES, tiny_whisper_in
from tests.test_registry import tiny_ct2_folder  # noqa: F401  (a fixture)


def _entry() -> Path:
    (entry,) = [p for p in cache_dir().iterdir() if p.name.startswith("ct2-")]
    return entry


def test_bit_rot_with_the_size_intact_is_caught_and_rebuilt(tiny_ct2_folder: Path,  # noqa: F811
                                                           caplog: pytest.LogCaptureFixture) -> None:
    first = {k: v.clone() for k, v in load_model(str(tiny_ct2_folder)).model.state_dict().items()}
    gc.collect()  # the loaded weights map the file
    weights = _entry() / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) * 3 // 4] ^= 0x10  # one bit, inside the tensor data: the file still loads
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = load_model(str(tiny_ct2_folder))
    assert "damaged" in caplog.text and "rebuilding" in caplog.text
    for name, value in again.model.state_dict().items():
        assert torch.equal(value, first[name]), name


def test_a_read_only_cache_with_a_complete_entry_loads(tiny_ct2_folder: Path,  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    load_model(str(tiny_ct2_folder))

    def no_writes(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Read-only file system")

    # Nothing may be created or locked when the entry is complete (a container image's cache).
    monkeypatch.setattr(cache, "_locked", no_writes)
    monkeypatch.setattr(Path, "mkdir", no_writes)
    assert load_model(str(tiny_ct2_folder)).model is not None

    gc.collect()
    weights = _entry() / "model.safetensors"
    weights.write_bytes(b"\x00" * weights.stat().st_size)  # damaged, and the cache cannot be rebuilt
    monkeypatch.setattr(cache, "_writable", lambda folder: False)
    with pytest.raises(ModelFileError, match="cannot be written.*ASSISTED_WHISPER_CACHE"):
        load_model(str(tiny_ct2_folder))


def test_a_folder_with_processor_config_json_loads(tmp_path: Path) -> None:
    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    extractor = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").unlink()
    # What `WhisperProcessor.save_pretrained` writes in current transformers.
    (folder / "processor_config.json").write_text(json.dumps({"feature_extractor": extractor,
                                                             "processor_class": "WhisperProcessor"}))
    bundle = load_model(str(folder))
    assert bundle.feature_extractor.feature_size == 80


@pytest.mark.parametrize("damage", ["tokenizer", "config"])
def test_garbage_model_files_are_one_line_errors_naming_the_file(tmp_path: Path, damage: str) -> None:
    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    name = "tokenizer.json" if damage == "tokenizer" else "config.json"
    (folder / name).write_text("{this is not json")
    with pytest.raises(ValueError, match="tokenizer" if damage == "tokenizer" else "config.json"):
        load_model(str(folder))
    result = CliRunner().invoke(main, ["transcribe", str(SAMPLES / "park.flac"), "--model", str(folder), "-q"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and str(folder) in result.output


@pytest.mark.parametrize("damage", ["a decoder layer missing", "more layers in the config", "another shape"])
def test_weights_that_miss_what_the_config_names_are_refused(tmp_path: Path, damage: str) -> None:
    """transformers would fill the gaps with random weights and transcribe nonsense with exit status 0."""
    from safetensors.torch import load_file, save_file

    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    weights = folder / "model.safetensors"
    config = json.loads((folder / "config.json").read_text())
    if damage == "a decoder layer missing":
        tensors = load_file(weights)
        save_file({k: v for k, v in tensors.items() if ".decoder.layers.1." not in k}, weights, metadata={"format": "pt"})
    elif damage == "more layers in the config":
        config["decoder_layers"] += 1
    else:
        tensors = load_file(weights)
        name = "model.decoder.layers.0.fc1.weight"
        tensors[name] = tensors[name][:-1].clone()
        save_file(tensors, weights, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="weights do not hold the tensors"):
        load_model(str(folder))
    result = CliRunner().invoke(main, ["transcribe", str(SAMPLES / "park.flac"), "--model", str(folder), "-q"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and str(folder) in result.output


@pytest.mark.parametrize("field, value, words", [
    ("d_model", 10 ** 9, "d_model = 1000000000"), ("decoder_layers", -1, "decoder_layers = -1"),
    ("vocab_size", None, "vocab_size"), ("encoder_layers", "two", "encoder_layers"),
    ("decoder_attention_heads", 3, "do not divide"), ("num_mel_bins", 128, "do not hold the tensors"),
    ("max_target_positions", 2, "do not hold the tensors"), ("max_source_positions", 10, "do not hold the tensors"),
])
def test_a_crafted_config_is_one_line(tmp_path: Path, field: str, value, words: str) -> None:
    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=re.escape(words)):
        load_model(str(folder))


def _crafted_weights(folder: Path, damage: str) -> None:
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + size]), raw[8 + size:]
    name = next(k for k in header if k != "__metadata__")
    prefix = None
    if damage == "a dtype that lies":
        header[name]["dtype"] = "F64"
    elif damage == "offsets beyond the file":
        header[name]["data_offsets"] = [0, 10 ** 12]
    elif damage == "another shape":
        header[name]["shape"] = [7, 7]
    elif damage == "a header that is an array":
        header = [1, 2, 3]
    elif damage == "a header length of 2^62":
        prefix = struct.pack("<Q", 2 ** 62)
    else:  # truncated
        body = body[: len(body) // 2]
    text = json.dumps(header).encode()
    path.write_bytes((prefix or struct.pack("<Q", len(text))) + text + body)


@pytest.mark.parametrize("damage", ["a dtype that lies", "offsets beyond the file", "another shape",
                                    "a header that is an array", "a header length of 2^62", "truncated"])
def test_crafted_safetensors_are_one_line(tmp_path: Path, damage: str) -> None:
    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    _crafted_weights(folder, damage)
    with pytest.raises(ModelFileError, match="the weights cannot be read"):
        load_model(str(folder))


@pytest.mark.parametrize("damage", ["a dtype that lies", "offsets beyond the file", "another shape",
                                    "a header that is an array", "a header length of 2^62", "truncated"])
def test_crafted_safetensors_are_one_line_when_offloaded_too(tmp_path: Path, damage: str) -> None:
    # Offloading reads the checkpoint itself, tensor by tensor: its header is checked as safetensors checks it
    # (a header length of 2^64 - 1 had it read the whole file and more into memory).
    from asr.models.offload import OffloadOptions

    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    _crafted_weights(folder, damage)
    with pytest.raises(ModelFileError, match=re.escape(str(folder))):
        load_model(str(folder), offload=OffloadOptions("disk"))


@pytest.mark.parametrize("field, value", [("hop_length", 200), ("sampling_rate", 8000), ("n_fft", 512),
                                          ("chunk_length", 10), ("feature_size", "80"), ("n_fft", 4.5)])
def test_a_feature_extractor_unlike_whispers_is_one_line(tmp_path: Path, field: str, value) -> None:
    # audio.features computes Whisper's framing; a config that asks for another would be silently ignored.
    folder = tiny_whisper_in(tmp_path / "model", seed=5)
    config = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ModelFileError, match=re.escape(str(folder))):
        load_model(str(folder))


def test_asr_models_does_not_hash_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "_sha256", lambda path: pytest.fail("hashed while listing"))
    assert CliRunner().invoke(main, ["models"]).exit_code == 0


def test_a_conversion_records_content_hashes(tiny_ct2_folder: Path) -> None:  # noqa: F811
    load_model(str(tiny_ct2_folder))
    marker = json.loads((_entry() / cache.MARKER).read_text())
    assert marker["sha256"].keys() == marker["files"].keys()
    assert marker["sha256"]["model.safetensors"] == cache._sha256(_entry() / "model.safetensors")
    shutil.rmtree(_entry())


def test_a_missing_relative_model_path_is_not_sent_to_the_hub(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(ValueError, match="no such model folder"):
        load_model("models/whisper-small")


def test_a_folder_without_a_suppress_list_still_suppresses_the_control_tokens(tmp_path: Path) -> None:
    folder = tiny_whisper_in(tmp_path / "model", seed=5)  # its generation config has no suppress_tokens
    special = load_model(str(folder)).special
    assert {special.sot, special.prev, special.transcribe, special.translate, special.no_speech} <= set(
        special.suppress_tokens)
