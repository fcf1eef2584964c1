"""Tests for audio/: loading every evaluation file and the samples, refusing bad input, resampling, log-mel."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    AudioError,
    duration_seconds,
    load_audio,
    log_mel,
    pad_or_trim,
    recording_floor,
)
from audio.features import _extractor, margins

REPO = Path(__file__).resolve().parents[1]
EVALDATA = REPO.parent / "shared" / "evaldata"
SAMPLES = REPO / "samples"
DURATION_TOLERANCE_S = 0.05


def _manifest_params(folders: list[Path], missing_reason: str) -> list:
    """One pytest param per manifest line in ``folders``: (audio path, duration_s)."""
    params = [
        pytest.param(folder / item["audio"], item["duration_s"], id=f"{folder.name}/{item['audio']}")
        for folder in folders
        for line in (folder / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
        for item in [json.loads(line)]
    ]
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason=missing_reason), id="missing")]


EVAL_FILES = _manifest_params(
    sorted(path.parent for path in EVALDATA.glob("*/manifest.jsonl")),
    f"no shared evaluation data at {EVALDATA}",
)
SAMPLE_FILES = _manifest_params([SAMPLES] if (SAMPLES / "manifest.jsonl").is_file() else [], "no samples/")


def _assert_loaded(audio: np.ndarray, expected_duration_s: float) -> None:
    assert audio.dtype == np.float32
    assert audio.ndim == 1
    assert audio.flags.c_contiguous
    assert np.isfinite(audio).all()
    assert np.abs(audio).max() > 0, "silent"
    assert duration_seconds(audio) == pytest.approx(expected_duration_s, abs=DURATION_TOLERANCE_S)


@pytest.mark.parametrize(("path", "duration_s"), EVAL_FILES)
def test_every_evaldata_file_loads_as_float32_mono_16k(path: Path, duration_s: float) -> None:
    _assert_loaded(load_audio(path), duration_s)


@pytest.mark.parametrize(("path", "duration_s"), SAMPLE_FILES)
def test_samples_load_and_are_small(path: Path, duration_s: float) -> None:
    assert sf.info(path).samplerate == SAMPLE_RATE
    assert path.stat().st_size < 150_000
    assert 3.0 <= duration_s <= 8.0
    _assert_loaded(load_audio(path), duration_s)


# --- bad input: AudioError naming the file --------------------------------------------------------------


@pytest.fixture
def no_ffmpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)


def _write_wav(path: Path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE, subtype: str = "PCM_16") -> Path:
    sf.write(path, samples, sample_rate, subtype=subtype)
    return path


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, a fragment the message must hold)."""
    directory = tmp_path / "folder.wav"
    directory.mkdir()
    empty = tmp_path / "empty.wav"
    empty.touch()
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio\n" * 20)
    nan = np.sin(np.linspace(0, 100, 16000)).astype(np.float32)
    nan[100] = np.nan
    inf = np.zeros(16000, dtype=np.float32)
    inf[5] = np.inf
    garbage_m4a = tmp_path / "talk.m4a"
    garbage_m4a.write_bytes(bytes(range(256)) * 8)
    return {
        "missing": (tmp_path / "nowhere.flac", "no such file"),
        "directory": (directory, "directory"),
        "empty": (empty, "empty"),
        "text": (text, "not a readable audio file"),
        "nan": (_write_wav(tmp_path / "nan.wav", nan, subtype="FLOAT"), "NaN"),
        "inf": (_write_wav(tmp_path / "inf.wav", inf, subtype="FLOAT"), "infinite"),
        "zero_frames": (_write_wav(tmp_path / "zero.wav", np.zeros(0, dtype=np.float32)), "no audio samples"),
        "m4a_without_ffmpeg": (garbage_m4a, "ffmpeg"),
    }


@pytest.mark.parametrize(
    "case", ["missing", "directory", "empty", "text", "nan", "inf", "zero_frames", "m4a_without_ffmpeg"]
)
def test_bad_input_raises_audio_error_naming_the_file(case: str, tmp_path: Path, no_ffmpeg: None) -> None:
    path, fragment = _bad_files(tmp_path)[case]
    with pytest.raises(AudioError) as caught:
        load_audio(path)
    message = str(caught.value)
    assert path.name in message
    assert fragment in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_m4a_without_ffmpeg_says_how_to_fix(tmp_path: Path, no_ffmpeg: None) -> None:
    path = tmp_path / "meeting.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    with pytest.raises(AudioError, match=r"meeting\.m4a: cannot decode this format without ffmpeg; install ffmpeg"):
        load_audio(path)


def _fake_ffmpeg(tmp_path: Path, body: str) -> Path:
    """An executable standing in for ffmpeg, so that the subprocess path is tested without ffmpeg."""
    script = tmp_path / "ffmpeg"
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_formats_soundfile_cannot_read_go_through_ffmpeg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_ffmpeg(
        tmp_path,
        "assert sys.argv[sys.argv.index('-ar') + 1] == '16000' and sys.argv[sys.argv.index('-ac') + 1] == '1'\n"
        "import array; sys.stdout.buffer.write(array.array('f', [0.25] * 8000).tobytes())",
    )
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: str(fake) if name == "ffmpeg" else None)
    path = tmp_path / "clip.m4a"
    path.write_bytes(bytes(512))
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.shape == (8000,)
    np.testing.assert_array_equal(audio, 0.25)
    audio[0] = 1.0  # writable, not a view of ffmpeg's output buffer


def test_ffmpeg_failure_is_an_audio_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_ffmpeg(tmp_path, "sys.stderr.write('x: Invalid data found when processing input\\n'); sys.exit(1)")
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: str(fake))
    path = tmp_path / "broken.webm"
    path.write_bytes(bytes(512))
    with pytest.raises(AudioError, match=r"broken\.webm: not a readable audio file \(ffmpeg: .*Invalid data"):
        load_audio(path)


# --- arrays --------------------------------------------------------------------------------------------


def test_array_is_returned_as_float32() -> None:
    audio = load_audio(np.linspace(-0.5, 0.5, 1000))
    assert audio.dtype == np.float32 and audio.shape == (1000,)
    assert duration_seconds(audio) == pytest.approx(1000 / SAMPLE_RATE)


@pytest.mark.parametrize(
    ("array", "fragment"),
    [
        (np.zeros(0, dtype=np.float32), "no audio samples"),
        (np.array([0.0, np.nan], dtype=np.float32), "NaN"),
        (np.zeros((2, 100), dtype=np.float32), "1-D"),
    ],
)
def test_bad_array_raises_audio_error(array: np.ndarray, fragment: str) -> None:
    with pytest.raises(AudioError, match=fragment):
        load_audio(array)


def test_sample_rate_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        load_audio(np.zeros(10, dtype=np.float32), sample_rate=0)


# --- resampling and downmixing ---------------------------------------------------------------------------


def test_44k_stereo_sine_is_averaged_and_resampled(tmp_path: Path) -> None:
    rate, seconds, freq = 44100, 2.0, 440.0
    t = np.arange(int(rate * seconds)) / rate
    sine = 0.5 * np.sin(2 * np.pi * freq * t)
    stereo = np.stack([sine, 0.5 * sine], axis=1)  # average: 0.75 x the left channel
    path = _write_wav(tmp_path / "sine44k.wav", stereo, sample_rate=rate, subtype="FLOAT")

    audio = load_audio(path)

    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(audio.size - int(seconds * SAMPLE_RATE)) <= 1
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    peak_hz = np.argmax(spectrum) * SAMPLE_RATE / audio.size
    assert peak_hz == pytest.approx(freq, abs=1.0)
    middle = audio[SAMPLE_RATE // 4 : -SAMPLE_RATE // 4]  # away from the resampler's edges
    assert np.abs(middle).max() == pytest.approx(0.75 * 0.5, rel=0.01)


def test_other_target_sample_rate(tmp_path: Path) -> None:
    path = _write_wav(tmp_path / "one_second.wav", np.zeros(16000, dtype=np.float32) + 0.1)
    assert load_audio(path, sample_rate=8000).shape == (8000,)


# --- features --------------------------------------------------------------------------------------------


def test_constants() -> None:
    assert (N_SAMPLES, HOP_LENGTH, N_FRAMES, FRAMES_PER_SECOND) == (480000, 160, 3000, 100)


def test_pad_or_trim() -> None:
    assert pad_or_trim(np.ones(10, dtype=np.float32), 16).tolist() == [1.0] * 10 + [0.0] * 6
    assert pad_or_trim(np.arange(20.0), 5).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert pad_or_trim(np.ones((2, 3)), 4).shape == (2, 4)
    exact = np.ones(N_SAMPLES, dtype=np.float32)
    assert pad_or_trim(exact) is exact


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_shape(n_mels: int) -> None:
    rng = np.random.default_rng(0)
    features = log_mel(rng.standard_normal(5 * SAMPLE_RATE).astype(np.float32) * 0.1, n_mels=n_mels)
    assert features.shape == (1, n_mels, N_FRAMES)
    assert features.dtype == torch.float32
    batch = log_mel([np.zeros(100, dtype=np.float32), rng.standard_normal(N_SAMPLES + 999)], n_mels=n_mels)
    assert batch.shape == (2, n_mels, N_FRAMES)
    assert torch.isfinite(batch).all()


def test_log_mel_pads_a_short_clip_with_zero_features_as_openai_whisper_decodes_it() -> None:
    """openai-whisper pads a window's features with 0 past the audio (`pad_or_trim` of the sliced spectrogram);
    the spectrogram of padded silence (transformers' extractor, and openai-whisper's language detection) lies
    near the floor instead, and the model hears the difference (docs/parity.md)."""
    audio = np.random.default_rng(1).standard_normal(7 * SAMPLE_RATE + 77).astype(np.float32) * 0.1
    silence_padded = _extractor(80)(audio, sampling_rate=SAMPLE_RATE, return_tensors="np")["input_features"]
    torch.testing.assert_close(log_mel(audio, pad_with_silence=True), torch.from_numpy(silence_padded))
    features = log_mel(audio)
    frames = len(audio) // HOP_LENGTH
    torch.testing.assert_close(features[..., :frames], torch.from_numpy(silence_padded[..., :frames]))
    assert (features[..., frames:] == 0).all()
    assert float(silence_padded[..., frames + 2:].max()) < -0.5


def test_log_mel_matches_openai_whisper_on_every_window() -> None:
    whisper = pytest.importorskip("whisper")
    audio = _loud_then_quiet(75)
    floor = recording_floor(audio)
    whole = whisper.log_mel_spectrogram(torch.from_numpy(audio), 80, padding=N_SAMPLES)
    content = whole.shape[-1] - N_FRAMES
    for seek in (0, 1, 1234, 6000):
        size = min(N_FRAMES, content - seek)
        expected = whisper.pad_or_trim(whole[:, seek:seek + size], N_FRAMES)
        start, end = seek * HOP_LENGTH, min(len(audio), seek * HOP_LENGTH + N_SAMPLES)
        window = log_mel([audio[start:end]], floors=[floor], around=[margins(audio, start, end)])[0]
        torch.testing.assert_close(window, expected, rtol=0, atol=1e-5)
    short = audio[:5 * SAMPLE_RATE + 3]
    mel = whisper.log_mel_spectrogram(torch.from_numpy(short), 80, padding=N_SAMPLES)
    torch.testing.assert_close(log_mel(short)[0], whisper.pad_or_trim(mel[:, :len(short) // HOP_LENGTH], N_FRAMES),
                               rtol=0, atol=1e-5)
    # A window that starts late in a recording shorter than 30 s is clamped at the recording's floor too.
    short = _loud_then_quiet(28)
    mel = whisper.log_mel_spectrogram(torch.from_numpy(short), 80, padding=N_SAMPLES)
    seek = 2200
    start = seek * HOP_LENGTH
    window = log_mel([short[start:]], floors=[recording_floor(short)], around=[margins(short, start, len(short))])
    expected = whisper.pad_or_trim(mel[:, seek:len(short) // HOP_LENGTH], N_FRAMES)
    torch.testing.assert_close(window[0], expected, rtol=0, atol=1e-5)
    assert float((log_mel(short[start:])[0] - expected).abs().max()) > 0.1  # its own floor is another
    short = audio[:5 * SAMPLE_RATE + 3]
    mel = whisper.log_mel_spectrogram(torch.from_numpy(short), 80, padding=N_SAMPLES)
    # Language detection sees the first 30 s of the padded file's spectrogram.
    torch.testing.assert_close(log_mel(short, pad_with_silence=True)[0], mel[:, :N_FRAMES], rtol=0, atol=1e-5)


def _loud_then_quiet(seconds: int = 75) -> np.ndarray:
    """Speech-level noise, then a last 15 s a thousand times quieter."""
    rng = np.random.default_rng(2)
    audio = rng.standard_normal(seconds * SAMPLE_RATE).astype(np.float32) * 0.1
    audio[-15 * SAMPLE_RATE:] *= 1e-3
    return audio


def test_a_window_cut_from_a_recording_is_normalised_as_the_whole_files_spectrogram() -> None:
    """openai-whisper clamps the log-mel of the whole file at its largest value less 8; a window clamped at its
    own largest would stretch a quiet window's noise over the model's whole range."""
    audio = _loud_then_quiet()
    floor = recording_floor(audio)
    whole = _extractor(80)(audio, sampling_rate=SAMPLE_RATE, return_tensors="np", truncation=False,
                           padding="longest")["input_features"][0]
    assert floor == pytest.approx(float(whole.min()), abs=1e-3)
    start = 60 * SAMPLE_RATE  # the quiet window: its own floor is far below the file's
    own = log_mel(audio[start:])[0]
    normalised = log_mel([audio[start:]], floors=[floor])[0]
    assert float(own.min()) < floor - 0.2
    assert float(normalised.min()) == pytest.approx(floor)
    # Away from the window's edges (whose STFT frames see padding), the whole file's features; at its edges too
    # when the frames there are given the recording around the window.
    frames = 15 * FRAMES_PER_SECOND - 2
    torch.testing.assert_close(normalised[:, 2:frames], torch.from_numpy(whole[:, 6002:6000 + frames]),
                               rtol=1e-4, atol=1e-4)
    framed = log_mel([audio[start:]], floors=[floor], around=[margins(audio, start, len(audio))])[0]
    torch.testing.assert_close(framed[:, :frames], torch.from_numpy(whole[:, 6000:6000 + frames]),
                               rtol=1e-4, atol=1e-4)
    # A loud window is its own: the recording's floor is its floor.
    torch.testing.assert_close(log_mel([audio[:N_SAMPLES]], floors=[floor]), log_mel(audio[:N_SAMPLES]))


def test_the_floor_of_a_recording_of_one_window_is_its_windows() -> None:
    audio = _loud_then_quiet(30)
    assert recording_floor(audio) == pytest.approx(float(log_mel(audio).min()), abs=1e-6)
    assert recording_floor(np.zeros(0, dtype=np.float32)) is None
    # Pieces taken a few at a time give the floor of all at once.
    audio = _loud_then_quiet(100)
    assert recording_floor(audio, windows_at_once=1) == recording_floor(audio)


def test_log_mel_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_mels"):
        log_mel(np.zeros(10, dtype=np.float32), n_mels=0)
    with pytest.raises(ValueError, match="at least one clip"):
        log_mel([])
