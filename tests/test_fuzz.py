"""Property-based fuzzing of the readers that take files from users: whatever the bytes, the CTranslate2 reader,
the manifest readers and the audio loader either succeed or raise their documented error type (one line).

Each property runs a fixed number of small examples (`FUZZ`), so the whole file stays within seconds in CI.
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from asr.batch.sources import iter_items  # noqa: E402
from asr.models.ct2 import ModelFileError, read_ct2  # noqa: E402
from audio import AudioError, load_audio  # noqa: E402
from tests.helpers_ct2 import write_ct2  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _valid_ct2() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.bin"
        write_ct2(path, {"a/weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                         "b/bias": torch.ones(5, dtype=torch.float16)}, {"c/weight": "a/weight"})
        return path.read_bytes()


VALID_CT2 = _valid_ct2()


def _mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """Valid files with bytes flipped, cut short, or with junk appended; and plain random bytes."""
    flips = st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)), min_size=1, max_size=8)

    def flipped(changes: list[tuple[int, int]]) -> bytes:
        data = bytearray(valid)
        for at, mask in changes:
            data[at] ^= mask
        return bytes(data)

    return st.one_of(flips.map(flipped), st.integers(0, len(valid)).map(lambda n: valid[:n]),
                     st.binary(max_size=64).map(lambda junk: valid + junk), st.binary(max_size=512))


def _one_line(error: Exception) -> None:
    assert str(error).strip() and "\n" not in str(error).strip()


@FUZZ
@given(data=_mutations(VALID_CT2))
def test_ct2_reader_accepts_or_raises_model_file_error(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("ct2") / "model.bin"
    path.write_bytes(data)
    try:
        read_ct2(path)
    except ModelFileError as error:
        _one_line(error)
        assert str(path) in str(error)


def test_ct2_reader_refuses_huge_declared_sizes(tmp_path: Path) -> None:
    # A header that declares a 4 GB tensor in a 100-byte file: refused before any allocation.
    data = struct.pack("<I", 6) + struct.pack("<H", 3) + b"ab\x00" + struct.pack("<II", 1, 1)
    data += struct.pack("<H", 2) + b"x\x00" + struct.pack("<B", 1) + struct.pack("<I", 1 << 30)
    data += struct.pack("<BI", 0, 0xFFFFFFFF)
    (tmp_path / "model.bin").write_bytes(data)
    with pytest.raises(ModelFileError):
        read_ct2(tmp_path / "model.bin")


def _ct2_string(text: bytes) -> bytes:
    return struct.pack("<H", len(text) + 1) + text + b"\x00"


DIMENSION = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF))
VARIABLE = st.fixed_dictionaries({
    "name": st.one_of(st.sampled_from([b"a/weight", b"", b"a/weight"]), st.binary(max_size=8)),
    "dims": st.lists(DIMENSION, max_size=10),
    "dtype": st.integers(0, 12),
    "n_bytes": st.one_of(st.none(), st.sampled_from([0, 1, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF)),
    "data": st.integers(0, 64),
})


@FUZZ
@given(variables=st.lists(VARIABLE, max_size=4), count=st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)),
       aliases=st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)), max_size=2),
       version=st.sampled_from([6, 6, 6, 5, 0, 0xFFFFFFFF]))
def test_ct2_reader_takes_any_header_in_one_line_and_baseline_memory(tmp_path_factory: pytest.TempPathFactory,
                                                                     variables: list[dict], count: int | None,
                                                                     aliases: list, version: int) -> None:
    """Every header field a crafted file can lie in (counts, names, ranks, dimensions from 0 to 2^32-1 in any
    combination, dtype codes, byte counts), not only flipped bytes: a result or one line, never a traceback."""
    import resource

    data = struct.pack("<I", version) + _ct2_string(b"WhisperSpec") + struct.pack("<I", 3)
    data += struct.pack("<I", len(variables) if count is None else count)
    for variable in variables:
        dims = variable["dims"]
        data += _ct2_string(variable["name"]) + struct.pack("<B", len(dims) % 256)
        data += b"".join(struct.pack("<I", d) for d in dims) + struct.pack("<B", variable["dtype"])
        elements = 1
        for d in dims:
            elements *= d
        n_bytes = variable["n_bytes"] if variable["n_bytes"] is not None else min(elements * 4, 0xFFFFFFFF)
        data += struct.pack("<I", n_bytes) + bytes(min(n_bytes, variable["data"] * 4))
    data += struct.pack("<I", len(aliases)) + b"".join(_ct2_string(a) + _ct2_string(b) for a, b in aliases)
    path = tmp_path_factory.mktemp("ct2-header") / "model.bin"
    path.write_bytes(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        read_ct2(path)
    except ModelFileError as error:
        _one_line(error)
        assert str(path) in str(error)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB: no big allocation


@pytest.mark.parametrize("dims", [[0, 0xFFFFFFFF], [0] + [0xFFFFFFFF] * 7, [0xFFFFFFFF] * 3 + [0]])
def test_ct2_empty_tensors_of_impossible_shapes_are_one_line(tmp_path: Path, dims: list[int]) -> None:
    data = struct.pack("<I", 6) + _ct2_string(b"WhisperSpec") + struct.pack("<II", 3, 1) + _ct2_string(b"x")
    data += struct.pack("<B", len(dims)) + b"".join(struct.pack("<I", d) for d in dims) + struct.pack("<BI", 0, 0)
    data += struct.pack("<I", 0)
    (tmp_path / "model.bin").write_bytes(data)
    try:
        read_ct2(tmp_path / "model.bin")
    except ModelFileError as error:
        _one_line(error)


def test_a_ct2_file_larger_than_memory_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    with open(path, "wb") as handle:
        try:
            handle.truncate(2 ** 40)  # 1 TiB, sparse: no disk used
        except OSError:
            pytest.skip("this file system holds no 1 TiB sparse file")
    with pytest.raises(ModelFileError, match="do not fit in this machine's memory"):
        read_ct2(path)


MANIFEST_TEXT = st.text(alphabet=st.sampled_from(list('ab,;"\'\t\n\r{}[]:\\ é\ufeff0.wav')), max_size=200)


@FUZZ
@given(text=MANIFEST_TEXT, suffix=st.sampled_from([".csv", ".tsv", ".jsonl", ".json"]))
def test_manifest_readers_yield_items_or_raise_value_error(tmp_path_factory: pytest.TempPathFactory, text: str,
                                                          suffix: str) -> None:
    path = tmp_path_factory.mktemp("manifest") / f"m{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        items = list(iter_items(str(path)))
    except ValueError as error:
        _one_line(error)
        return
    for item in items:
        assert isinstance(item.id, str) and (item.audio is None) == (item.error is not None or item.audio is None)
        if item.error is not None:
            assert "\n" not in item.error


def _valid_audio(suffix: str, **kwargs: object) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"a{suffix}"
        t = np.arange(8000) / 16000
        sf.write(path, (0.9 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, **kwargs)
        return path.read_bytes()


VALID_AUDIO = {".wav": _valid_audio(".wav", subtype="PCM_16"), ".flac": _valid_audio(".flac"),
               ".mp3": _valid_audio(".mp3", format="MP3")}


@pytest.mark.parametrize("suffix", list(VALID_AUDIO))
@FUZZ
@given(data=st.data())
def test_audio_loader_returns_sane_samples_or_raises_audio_error(tmp_path_factory: pytest.TempPathFactory,
                                                                 suffix: str, data: st.DataObject) -> None:
    data = data.draw(_mutations(VALID_AUDIO[suffix]))
    path = tmp_path_factory.mktemp("audio") / f"a{suffix}"
    path.write_bytes(data)
    try:
        samples = load_audio(path)
    except AudioError as error:
        _one_line(error)
        return
    assert samples.dtype == np.float32 and samples.ndim == 1 and samples.size > 0
    assert np.isfinite(samples).all() and np.abs(samples).max() <= 1.0


WAV_FIELDS = {
    "format": st.sampled_from([1, 3, 0xFFFE, 2, 0, 0x55]),
    "channels": st.sampled_from([0, 1, 2, 6, 255, 65535]),
    "rate": st.sampled_from([0, 1, 8000, 16000, 44100, 768000, 768001, 2 ** 31, 2 ** 32 - 1]),
    "bits": st.sampled_from([0, 7, 8, 16, 24, 32, 64, 65535]),
    "block_lie": st.sampled_from([None, 0, 1, 65535]),
    "data_size": st.sampled_from([None, 0, 1, 2 ** 31, 2 ** 32 - 1]),
    "riff_size": st.sampled_from([None, 0, 4, 2 ** 32 - 1]),
    "frames": st.integers(0, 4000),
}


HONEST_WAV = {"format": 1, "channels": 1, "rate": 16000, "bits": 16, "block_lie": None, "data_size": None,
              "riff_size": None}


@FUZZ
@given(data=st.data())
def test_wav_headers_that_lie_give_sane_samples_or_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                            data: st.DataObject) -> None:
    """Fields of a WAV header crafted (format, channels, rate, bits, block size, data and RIFF sizes; one to all
    of them) over a little real data: sane samples or one line, at about baseline memory (data under 64 KB)."""
    import resource

    lies = data.draw(st.sets(st.sampled_from(sorted(HONEST_WAV)), min_size=1, max_size=len(HONEST_WAV)))
    fields = {**HONEST_WAV, **{name: data.draw(WAV_FIELDS[name]) for name in lies},
              "frames": data.draw(WAV_FIELDS["frames"])}

    channels, bits = fields["channels"], fields["bits"]
    block = fields["block_lie"] if fields["block_lie"] is not None else max(1, channels * bits // 8) % 65536
    data = np.random.default_rng(0).integers(-2000, 2000, fields["frames"] * 8, dtype=np.int16).tobytes()[:65536]
    data_size = len(data) if fields["data_size"] is None else fields["data_size"]
    fmt = struct.pack("<HHIIHH", fields["format"], channels, fields["rate"],
                      (fields["rate"] * block) % 2 ** 32, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_size) + data
    riff = len(body) if fields["riff_size"] is None else fields["riff_size"]
    path = tmp_path_factory.mktemp("wav") / "a.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", riff) + body)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        samples = load_audio(path)
    except AudioError as error:
        _one_line(error)
        assert str(path) in str(error)
        event("refused")
    else:
        event("read")
        assert samples.dtype == np.float32 and samples.ndim == 1 and samples.size > 0
        assert np.isfinite(samples).all() and np.abs(samples).max() <= 1.0
        assert samples.size <= 16000 * (len(data) + 1)  # never more audio than the bytes hold
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024
