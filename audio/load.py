"""Load any audio file as float32 mono samples at 16 kHz.

libsndfile (through soundfile) reads WAV, FLAC, Ogg Vorbis/Opus, MP3 and AIFF; everything else (m4a, mp4,
webm, ...) goes through the ``ffmpeg`` command when it is installed. Bad input raises :class:`AudioError`
with a one-line message that names the file and the problem.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from audio.constants import SAMPLE_RATE

logger = logging.getLogger(__name__)


# Containers that libsndfile cannot open; without ffmpeg we say so instead of a bare "format not recognised".
_FFMPEG_ONLY_SUFFIXES = frozenset(
    {".m4a", ".mp4", ".m4b", ".aac", ".webm", ".mkv", ".mka", ".mov", ".wma", ".amr", ".3gp", ".ac3"}
)
_ARRAY_NAME = "<array>"


class AudioError(ValueError):
    """Audio that cannot be used: missing, unreadable, empty, or with non-finite samples."""


def load_audio(path: str | os.PathLike | np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Read an audio file (or check an in-memory array) as float32 mono samples at ``sample_rate``.

    Channels are averaged; other sample rates are resampled with soxr (``soxr_hq``). An array is taken to be
    mono samples already at ``sample_rate``: it is checked and returned as float32, not resampled.

    Args:
        path: An audio file, or a 1-D array of samples ``[n_samples]``.
        sample_rate: The sample rate of the result, in Hz.

    Returns:
        Samples ``[n_samples]``, float32, C-contiguous.

    Raises:
        AudioError: The file is missing, a directory, empty, not decodable audio, holds zero samples or
            NaN/inf samples; or the array is not 1-D, empty or not finite.
        ValueError: ``sample_rate`` is not a positive integer.
    """
    if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if isinstance(path, np.ndarray):
        if path.ndim != 1:
            raise AudioError(f"{_ARRAY_NAME}: expected 1-D mono samples, got an array of shape {path.shape}")
        return _checked(np.ascontiguousarray(path, dtype=np.float32), _ARRAY_NAME)

    name = os.fspath(path)
    file = Path(name)
    if not file.exists():
        raise AudioError(f"{name}: no such file")
    if file.is_dir():
        raise AudioError(f"{name}: is a directory, not an audio file")
    if file.stat().st_size == 0:
        raise AudioError(f"{name}: file is empty (0 bytes)")

    # Imported here: librosa takes about a second to import, and arrays need neither.
    import soundfile as sf

    try:
        samples, file_rate = sf.read(name, dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError) as sf_error:
        # LibsndfileError.error_string is libsndfile's reason alone, without the path repeated.
        reason = _one_line(getattr(sf_error, "error_string", sf_error)).rstrip(".")
        audio = _checked(_decode_with_ffmpeg(name, sample_rate, reason), name)
    else:
        # Check before mixing and resampling: those would smear a NaN across its neighbours.
        samples = _checked(samples, name)
        audio = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
        if file_rate != sample_rate:
            logger.debug("%s: resampling %d Hz -> %d Hz", name, file_rate, sample_rate)
            import librosa

            audio = librosa.resample(audio, orig_sr=file_rate, target_sr=sample_rate, res_type="soxr_hq")
    return np.ascontiguousarray(audio, dtype=np.float32)


def duration_seconds(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Length of mono samples in seconds.

    Args:
        audio: Samples ``[n_samples]``.
        sample_rate: Their sample rate, in Hz.

    Returns:
        ``n_samples / sample_rate``.
    """
    return audio.shape[-1] / sample_rate


def _checked(samples: np.ndarray, name: str) -> np.ndarray:
    """Raise AudioError for zero samples or non-finite ones; return ``samples`` unchanged otherwise."""
    if samples.size == 0:
        raise AudioError(f"{name}: contains no audio samples")
    if not np.isfinite(samples).all():
        raise AudioError(f"{name}: contains NaN or infinite samples")
    return samples


def _decode_with_ffmpeg(name: str, sample_rate: int, soundfile_reason: str) -> np.ndarray:
    """Decode what libsndfile cannot read with the ffmpeg command: mono f32le at ``sample_rate`` on stdout."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        if Path(name).suffix.lower() in _FFMPEG_ONLY_SUFFIXES:
            raise AudioError(f"{name}: cannot decode this format without ffmpeg; install ffmpeg or convert to wav/flac")
        raise AudioError(f"{name}: not a readable audio file (libsndfile: {soundfile_reason}; ffmpeg not installed)")
    logger.debug("%s: soundfile cannot read it (%s); decoding with ffmpeg", name, soundfile_reason)
    command = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-i", name,
               "-vn", "-f", "f32le", "-acodec", "pcm_f32le", "-ac", "1", "-ar", str(sample_rate), "-"]
    try:
        result = subprocess.run(command, capture_output=True, check=False)
    except OSError as error:
        raise AudioError(f"{name}: could not run ffmpeg ({error})") from error
    if result.returncode != 0:
        reason = _one_line(result.stderr.decode(errors="replace")) or f"exit status {result.returncode}"
        raise AudioError(f"{name}: not a readable audio file (ffmpeg: {reason})")
    return np.frombuffer(result.stdout, dtype=np.float32).copy()


def _one_line(message: object) -> str:
    """The last non-blank line of an error message, so that AudioError messages stay on one line."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return lines[-1] if lines else ""
