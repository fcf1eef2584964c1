"""Property-based fuzzing of the folders users hand over: a transformers model folder (config.json, the
safetensors header, the tokenizer and feature-extractor files) loaded in memory and offloaded, and a draft
folder (draft.json and its weights). Whatever the files say, loading gives a working model or a one-line
`ValueError` naming the folder, at about baseline memory; never a traceback.

Each example writes one crafted file beside links to the untouched ones, so a load costs a fraction of a second;
the example counts (`FOLDERS`) keep the file within the fast layer's budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from asr.assist.draft_model import DraftDecoder, load_draft, save_draft  # noqa: E402
from asr.models.offload import OffloadOptions  # noqa: E402
from asr.models.registry import load_model  # noqa: E402
from asr.options import TranscribeOptions  # noqa: E402
from asr.transcription import transcribe  # noqa: E402

FOLDERS = settings(max_examples=100, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TRANSCRIBING = settings(FOLDERS, max_examples=25)  # each example loads a model and transcribes a second
_MEMORY_KIB = 256 * 1024  # what a load may add to the peak resident set: the tiny model is 15 MB

# Values a crafted JSON field may hold: the edges of every type a parser may trust.
JSON_VALUE = st.one_of(
    st.sampled_from([0, 1, 2, -1, 3, 80, 128, 2 ** 31, 2 ** 32 - 1, 2 ** 63, -(2 ** 63), 10 ** 30]),
    st.integers(-5, 100_000), st.sampled_from([0.5, 1e308, -0.0]), st.just(float("nan")), st.just(float("inf")),
    st.none(), st.booleans(), st.text(max_size=6), st.lists(st.integers(-2, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.fixture(scope="module")
def model_folder(tiny_whisper_folder: Path) -> Path:
    return tiny_whisper_folder


@contextlib.contextmanager
def _crafted(model_folder: Path, name: str, content: bytes) -> Iterator[Path]:
    """A copy of `model_folder` (links to its files) with `name` replaced by `content`, removed after the
    example: kept, a thousand 14 MB crafted checkpoints filled the disk of the machine that runs CI."""
    with tempfile.TemporaryDirectory(prefix="crafted-") as parent:
        folder = Path(parent) / "model"
        folder.mkdir()
        for file in model_folder.iterdir():
            if file.name != name:
                os.symlink(file, folder / file.name)
        (folder / name).write_bytes(content)
        yield folder


def _loads_or_one_line(folder: Path, offload: bool, transcribe_after: bool = False) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        bundle = load_model(str(folder), offload=OffloadOptions("disk") if offload else None)
        if transcribe_after:
            options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=4, timestamps=False)
            transcribe(bundle, np.zeros(16000, dtype=np.float32), options)
    except ValueError as error:
        message = str(error).strip()
        assert message and "\n" not in message, message
        assert str(folder) in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < _MEMORY_KIB


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@FOLDERS
@given(data=st.data(), offload=st.booleans())
def test_any_config_json_loads_or_is_one_line(model_folder: Path, data: st.DataObject, offload: bool) -> None:
    config = json.loads((model_folder / "config.json").read_text())
    fields = sorted(config)
    crafted = data.draw(st.one_of(
        st.dictionaries(st.sampled_from(fields), JSON_VALUE, min_size=1, max_size=3).map(lambda c: {**config, **c}),
        st.lists(st.sampled_from(fields), min_size=1, max_size=3).map(
            lambda gone: {k: v for k, v in config.items() if k not in gone}),
        JSON_VALUE))
    text = _json_bytes(crafted)
    if data.draw(st.booleans()):
        text = text[:data.draw(st.integers(0, len(text)))]
    with _crafted(model_folder, "config.json", text) as folder:
        _loads_or_one_line(folder, offload)


def _safetensors(model_folder: Path) -> tuple[dict, bytes]:
    raw = (model_folder / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size]), raw[8 + size:]


SHAPE = st.lists(st.sampled_from([0, 1, 2, 64, 65, -1, 2 ** 32 - 1, 2 ** 62, 2 ** 64]), max_size=4)
DTYPE = st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "I64", "BOOL", "F8_E4M3", "X", ""])


@FOLDERS
@given(data=st.data(), offload=st.booleans())
def test_any_safetensors_header_loads_or_is_one_line(model_folder: Path, data: st.DataObject, offload: bool) -> None:
    header, body = _safetensors(model_folder)
    names = sorted(k for k in header if k != "__metadata__")
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(names))
        entry = header[name]
        change = data.draw(st.sampled_from(["dtype", "shape", "offsets", "drop", "rename", "field", "value"]))
        if change == "dtype":
            entry["dtype"] = data.draw(DTYPE)
        elif change == "shape":
            entry["shape"] = data.draw(SHAPE)
        elif change == "offsets":
            entry["data_offsets"] = data.draw(st.lists(st.sampled_from(
                [0, 4, len(body), len(body) + 4, -4, 2 ** 63, 2 ** 64 + 1]), max_size=3))
        elif change == "drop":
            header.pop(name)
            names.remove(name)
            if not names:
                break
        elif change == "rename":
            header[data.draw(st.text(max_size=12))] = header.pop(name)
            names = sorted(k for k in header if k != "__metadata__")
        elif change == "field":
            entry.pop(data.draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
        else:
            header[name] = data.draw(JSON_VALUE)
            names.remove(name)
            if not names:
                break
    text = _json_bytes(header)
    length = data.draw(st.one_of(st.just(len(text)), st.sampled_from([0, 1, len(text) + 8, 2 ** 62, 2 ** 64 - 1])))
    tail = data.draw(st.sampled_from(["whole", "cut", "junk"]))
    body = body[: len(body) // 3] if tail == "cut" else body + b"\x00" * 16 if tail == "junk" else body
    content = struct.pack("<Q", length) + text + body
    with _crafted(model_folder, "model.safetensors", content) as folder:
        _loads_or_one_line(folder, offload)


@TRANSCRIBING
@given(data=st.data())
def test_any_feature_extractor_config_transcribes_or_is_one_line(model_folder: Path, data: st.DataObject) -> None:
    """The preprocessor config decides the features' shape: a load that passes must also transcribe."""
    config = json.loads((model_folder / "preprocessor_config.json").read_text())
    fields = sorted(config)
    crafted = data.draw(st.one_of(
        st.dictionaries(st.sampled_from(fields), JSON_VALUE, min_size=1, max_size=3).map(lambda c: {**config, **c}),
        JSON_VALUE))
    with _crafted(model_folder, "preprocessor_config.json", _json_bytes(crafted)) as folder:
        _loads_or_one_line(folder, offload=False, transcribe_after=True)


@TRANSCRIBING
@given(data=st.data())
def test_any_tokenizer_files_load_or_are_one_line(model_folder: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["tokenizer.json", "tokenizer_config.json", "generation_config.json"]))
    raw = (model_folder / name).read_bytes()
    if name == "tokenizer.json":  # 4 MB: cut it, or replace a top-level part
        tokenizer = json.loads(raw)
        part = data.draw(st.sampled_from(sorted(tokenizer)))
        content = data.draw(st.one_of(
            st.integers(0, len(raw)).map(lambda n: raw[:n]),
            JSON_VALUE.map(lambda value: _json_bytes({**tokenizer, part: value}))))
    else:
        config = json.loads(raw)
        content = _json_bytes(data.draw(st.one_of(
            st.dictionaries(st.sampled_from(sorted(config)), JSON_VALUE, min_size=1, max_size=3).map(
                lambda c: {**config, **c}),
            JSON_VALUE)))
    with _crafted(model_folder, name, content) as folder:
        _loads_or_one_line(folder, offload=False, transcribe_after=True)


@pytest.fixture(scope="module")
def tiny_bundle(model_folder: Path):
    return load_model(str(model_folder))


@pytest.fixture(scope="module")
def draft_folder(tiny_bundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("draft") / "tiny-draft"
    draft = DraftDecoder(tiny_bundle.model, [1])
    draft.restrict_vocabulary(torch.arange(0, 51865, 7))
    save_draft(draft, tiny_bundle.model, folder, model_name="tiny", training={})
    return folder


@FOLDERS
@given(data=st.data())
def test_any_draft_folder_drafts_or_is_one_line(tiny_bundle, draft_folder: Path, data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(["draft.json", "model.safetensors"]))
    if which == "draft.json":
        description = json.loads((draft_folder / "draft.json").read_text())
        content = _json_bytes(data.draw(st.one_of(
            st.dictionaries(st.sampled_from(sorted(description)), st.one_of(
                JSON_VALUE, st.lists(st.sampled_from([0, 1, 2, -1, 5, 2 ** 40]), max_size=4)),
                min_size=1, max_size=2).map(lambda c: {**description, **c}),
            JSON_VALUE)))
    else:
        header, body = _safetensors(draft_folder)
        name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        change = data.draw(st.sampled_from(["shape", "dtype", "value", "drop"]))
        if change == "shape":
            header[name]["shape"] = data.draw(SHAPE)
        elif change == "dtype":
            header[name]["dtype"] = data.draw(DTYPE)
        elif change == "drop":
            header.pop(name)
        else:  # every element of the tensor replaced: a vocabulary of negative or huge ids, NaN weights
            begin, end = header[name]["data_offsets"]
            fill = data.draw(st.sampled_from([b"\xff", b"\x7f", b"\x00", b"\x80"]))
            body = body[:begin] + fill * (end - begin) + body[end:]
        text = _json_bytes(header)
        content = struct.pack("<Q", len(text)) + text + body
    with _crafted(draft_folder, which, content) as folder:
        _drafts_or_one_line(tiny_bundle, folder)


def _drafts_or_one_line(tiny_bundle, folder: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        draft = load_draft(folder, tiny_bundle.model)
        ids = torch.tensor([[50258, 50259, 50359, 50363]])
        states = torch.zeros(1, 1500 // 20, tiny_bundle.model.config.d_model)
        logits = draft(ids, states)
        assert logits.shape[-1] == tiny_bundle.model.config.vocab_size
    except ValueError as error:
        message = str(error).strip()
        assert message and "\n" not in message and str(folder) in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < _MEMORY_KIB
