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


# Frames that soundfile reads at a time: a long stereo file is mixed (or one channel taken) block by block, so
# the whole multi-channel signal is never in memory at once.
_BLOCK_FRAMES = 1 << 20
# Sample rates a recording may have (telephone 8 kHz and below, studio 384 kHz and above are rare but real).
MIN_SAMPLE_RATE = 1000
MAX_SAMPLE_RATE = 768000
# Peaks up to this are a loud recording's decoder overshoot, clipped to [-1, 1]; beyond it the data is damaged.
MAX_OVERSHOOT = 2.0


class ChannelError(AudioError):
    """The channel asked for is not in the audio (channel 1 of a mono file, say)."""

    def __init__(self, message: str, channels: int) -> None:
        super().__init__(message)
        self.channels = channels


def load_audio(path: str | os.PathLike | np.ndarray | bytes, sample_rate: int = SAMPLE_RATE,
               channel: int | None = None) -> np.ndarray:
    """Read an audio file, its bytes, or an in-memory array as float32 mono samples at ``sample_rate``.

    Channels are averaged unless ``channel`` picks one (0: left, 1: right); other sample rates are resampled
    with soxr (``soxr_hq``). An array is taken to be mono samples already at ``sample_rate``: it is checked and
    returned as float32, not resampled. Bytes are a whole file's contents (``sys.stdin.buffer.read()``), read
    as :func:`load_audio_bytes` reads them.

    Args:
        path: An audio file, its bytes, or a 1-D array of samples ``[n_samples]``.
        sample_rate: The sample rate of the result, in Hz.
        channel: None to average the channels, or the index of the one channel to return (files and bytes
            only). To transcribe the two sides of a stereo call apart, load ``channel=0`` and ``channel=1``.

    Returns:
        Samples ``[n_samples]``, float32, C-contiguous.

    Raises:
        AudioError: The file is missing, a directory, empty, not decodable audio, holds zero samples or
            NaN/inf samples; or the array is not 1-D, empty or not finite.
        ChannelError: (an AudioError) ``channel`` is not below the number of channels.
        ValueError: ``sample_rate`` is not a positive integer, ``channel`` is negative, or given with an array.
    """
    _check_arguments(sample_rate, channel)
    if isinstance(path, (bytes, bytearray, memoryview)):
        return load_audio_bytes(path, sample_rate, channel)
    if isinstance(path, np.ndarray):
        if channel is not None:
            raise ValueError("channel applies to files and bytes; index the channel of an array yourself")
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
    return _decode(name, name, None, sample_rate, channel)


def load_audio_bytes(data: bytes, sample_rate: int = SAMPLE_RATE, channel: int | None = None,
                     name: str = "<stdin>") -> np.ndarray:
    """A whole audio file's bytes as float32 mono samples: WAV, FLAC, Ogg, MP3 through soundfile, other
    formats through ffmpeg reading a pipe. ``name`` stands for the source in error messages.

    Raises:
        AudioError: no bytes, not decodable audio, zero samples or NaN/inf samples.
        ChannelError: ``channel`` is not below the number of channels.
    """
    _check_arguments(sample_rate, channel)
    if len(data) == 0:
        raise AudioError(f"{name}: no audio data (0 bytes)")
    import io

    return _decode(io.BytesIO(data), name, bytes(data), sample_rate, channel)


def _check_arguments(sample_rate: object, channel: object) -> None:
    if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if channel is not None and (isinstance(channel, bool) or not isinstance(channel, (int, np.integer))
                                or channel < 0):
        raise ValueError(f"channel must be None or an integer >= 0, got {channel!r}")


def _decode(source, name: str, data: bytes | None, sample_rate: int, channel: int | None) -> np.ndarray:
    """Decode a file name or file object with soundfile, else with ffmpeg (the file, or ``data`` on a pipe)."""
    # Imported here: librosa takes about a second to import, and arrays need neither.
    import soundfile as sf

    try:
        sound = sf.SoundFile(source)
    except (sf.SoundFileError, RuntimeError) as sf_error:
        # LibsndfileError.error_string is libsndfile's reason alone, without the path repeated.
        reason = _one_line(getattr(sf_error, "error_string", sf_error)).rstrip(".")
        audio = _checked(_decode_with_ffmpeg(name, data, sample_rate, reason, channel), name)
    else:
        with sound:
            _check_rate(name, sound.samplerate)
            _check_channel(name, channel, sound.channels)
            audio = _checked(_read_mono(sound, name, channel, sample_rate), name)
    return _in_range(np.ascontiguousarray(audio, dtype=np.float32), name)


def _read_mono(sound, name: str, channel: int | None, sample_rate: int) -> np.ndarray:
    """The channels averaged (or the one asked for), read and resampled (soxr, high quality) block by block:
    memory holds the result at `sample_rate` and one block, never the file's own rate or channels whole.
    (Streamed soxr gives the samples of one call over the whole signal.)"""
    import soundfile as sf
    import soxr

    resampler = None
    if sound.samplerate != sample_rate:
        logger.debug("%s: resampling %d Hz -> %d Hz", name, sound.samplerate, sample_rate)
        resampler = soxr.ResampleStream(sound.samplerate, sample_rate, 1, dtype="float32", quality="HQ")
    parts = []
    try:
        for block in sound.blocks(blocksize=_BLOCK_FRAMES, dtype="float32", always_2d=True):
            # Check before mixing and resampling: those would smear a NaN across its neighbours.
            if not np.isfinite(block).all():
                raise AudioError(f"{name}: contains NaN or infinite samples")
            if channel is not None:
                mono = block[:, channel].copy()
            else:
                mono = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0].copy()
            parts.append(resampler.resample_chunk(mono) if resampler is not None else mono)
    except (sf.SoundFileError, RuntimeError) as error:  # a file cut short or damaged after its header
        reason = _one_line(getattr(error, "error_string", error)).rstrip(".")
        raise AudioError(f"{name}: damaged audio data ({reason})") from None
    if resampler is not None:
        parts.append(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def _check_rate(name: str, rate: int) -> None:
    """Refuses sample rates no recording has: a header that claims 1 Hz would resample to hours of audio."""
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz; "
                         "the file's header is damaged or wrong")


def _in_range(samples: np.ndarray, name: str) -> np.ndarray:
    """Samples in [-1, 1]. Decoders of lossy formats overshoot a little on loud recordings: such peaks (up to
    `MAX_OVERSHOOT`) are clipped. Far beyond that the data is damaged (a bit-flipped MP3 frame decodes to
    values of hundreds), and Whisper would hear only noise: refused."""
    peak = float(np.abs(samples).max()) if samples.size else 0.0
    if peak > MAX_OVERSHOOT:
        raise AudioError(f"{name}: damaged audio data (samples reach {peak:.3g}, far outside [-1, 1])")
    if peak > 1.0:
        np.clip(samples, -1.0, 1.0, out=samples)
    return samples


def _check_channel(name: str, channel: int | None, channels: int) -> None:
    if channel is not None and channel >= channels:
        kind = "mono" if channels == 1 else f"{channels}-channel"
        raise ChannelError(f"{name}: {kind} audio has no channel {channel}", channels)


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


def check_audio_head(head: bytes, name: str = "<stdin>") -> None:
    """Refuses the first bytes of a stream when libsndfile cannot read them as audio and no ffmpeg is installed
    (which reads formats the first bytes cannot tell), so that a pipe of anything else fails before it is read
    whole.

    Raises:
        AudioError: the same line `load_audio_bytes` would give for the whole stream.
    """
    import io

    import soundfile as sf

    if not head or shutil.which("ffmpeg") is not None:
        return
    try:
        sf.info(io.BytesIO(head))
    except (sf.SoundFileError, RuntimeError) as error:
        reason = _one_line(getattr(error, "error_string", error)).rstrip(".")
        raise AudioError(f"{name}: not a readable audio file (libsndfile: {reason}; ffmpeg not installed)") from None


def _decode_with_ffmpeg(name: str, data: bytes | None, sample_rate: int, soundfile_reason: str,
                        channel: int | None = None) -> np.ndarray:
    """Decode what libsndfile cannot read with the ffmpeg command (the file, or ``data`` on its stdin): mono f32le
    at ``sample_rate``, or with ``channel`` every channel as a float WAV, from which that one is taken."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        if Path(name).suffix.lower() in _FFMPEG_ONLY_SUFFIXES:
            raise AudioError(f"{name}: cannot decode this format without ffmpeg; install ffmpeg or convert to wav/flac")
        raise AudioError(f"{name}: not a readable audio file (libsndfile: {soundfile_reason}; ffmpeg not installed)")
    logger.debug("%s: soundfile cannot read it (%s); decoding with ffmpeg", name, soundfile_reason)
    source = ["-nostdin", "-i", name] if data is None else ["-i", "pipe:0"]
    output = ["-f", "f32le", "-ac", "1"] if channel is None else ["-f", "wav"]
    command = [ffmpeg, "-hide_banner", "-loglevel", "error", *source,
               "-vn", *output, "-acodec", "pcm_f32le", "-ar", str(sample_rate), "-"]
    try:
        result = subprocess.run(command, input=data, capture_output=True, check=False)
    except OSError as error:
        raise AudioError(f"{name}: could not run ffmpeg ({error})") from error
    if result.returncode != 0:
        reason = _one_line(result.stderr.decode(errors="replace")) or f"exit status {result.returncode}"
        raise AudioError(f"{name}: not a readable audio file (ffmpeg: {reason})")
    if channel is None:
        return np.frombuffer(result.stdout, dtype=np.float32).copy()
    channels, samples = _float_wav(result.stdout, name)
    _check_channel(name, channel, channels)
    return samples.reshape(-1, channels)[:, channel].copy()


def _float_wav(wav: bytes, name: str) -> tuple[int, np.ndarray]:
    """(channels, interleaved float32 samples) of the float WAV that ffmpeg writes to a pipe (whose chunk sizes
    it cannot fill in, so the data chunk is taken to run to the end)."""
    position, channels = 12, None
    while position + 8 <= len(wav):
        chunk, size = wav[position:position + 4], int.from_bytes(wav[position + 4:position + 8], "little")
        if chunk == b"fmt ":
            channels = int.from_bytes(wav[position + 10:position + 12], "little")
        elif chunk == b"data" and channels:
            body = wav[position + 8:]
            usable = len(body) - len(body) % (4 * channels)
            return channels, np.frombuffer(body[:usable], dtype="<f4").astype(np.float32)
        position += 8 + size + (size & 1)
    raise AudioError(f"{name}: ffmpeg gave no readable audio")


def _one_line(message: object) -> str:
    """The last non-blank line of an error message, so that AudioError messages stay on one line."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return lines[-1] if lines else ""
