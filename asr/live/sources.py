"""Where live audio comes from: a file (as fast as it decodes, or paced by the clock), raw PCM on a pipe, or a
microphone. Each source yields 16 kHz mono float32 chunks; the stream updates after each."""

from __future__ import annotations

import queue
import time
from typing import BinaryIO, Callable, Iterator

import numpy as np

from audio.constants import SAMPLE_RATE

#: What `asr listen` needs beyond the package, in one line.
MICROPHONE_NEEDS = ("asr listen needs the sounddevice package and the PortAudio library: "
                    "pip install 'assisted-whisper[live]' and, on Debian or Ubuntu, apt install libportaudio2")


def file_chunks(samples: np.ndarray, step: float, realtime: bool,
                clock: Callable[[], float] = time.monotonic) -> Iterator[np.ndarray]:
    """`samples` in chunks of `step` seconds; with `realtime`, each chunk once the clock has reached its end,
    and everything that arrived meanwhile when decoding fell behind (at least `step` seconds each time)."""
    size = max(1, int(round(step * SAMPLE_RATE)))
    if not realtime:
        for start in range(0, len(samples), size):
            yield samples[start:start + size]
        return
    began, sent = clock(), 0
    while sent < len(samples):
        arrived = min(len(samples), int((clock() - began) * SAMPLE_RATE))
        if arrived - sent < size and arrived < len(samples):
            time.sleep((sent + size - arrived) / SAMPLE_RATE)
            continue
        yield samples[sent:arrived]
        sent = arrived


class PcmDecoder:
    """Raw signed 16-bit little-endian mono PCM at `rate`, as it arrives in pieces of any size, to 16 kHz float32
    samples. An odd byte waits for its pair; one left at the end is dropped."""

    def __init__(self, rate: int = SAMPLE_RATE) -> None:
        self.rate, self.carry, self.resampler = rate, b"", None
        if rate != SAMPLE_RATE:
            import soxr

            self.resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def samples(self, data: bytes, last: bool = False) -> np.ndarray:
        """The samples of `data` after what came before; `last`: the stream ends here (the resampler's tail)."""
        data = self.carry + data
        usable = len(data) - len(data) % 2
        self.carry = data[usable:]
        samples = np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0
        return self.resampler.resample_chunk(samples, last=last) if self.resampler is not None else samples


def pcm_chunks(stream: BinaryIO, step: float, rate: int = SAMPLE_RATE) -> Iterator[np.ndarray]:
    """Raw signed 16-bit little-endian mono PCM at `rate` (what `arecord -f S16_LE -c 1 -t raw` writes), in
    chunks of `step` seconds at 16 kHz (`PcmDecoder`)."""
    decoder = PcmDecoder(rate)
    wanted = max(2, int(round(step * rate)) * 2)
    while True:
        data = _read_up_to(stream, wanted - len(decoder.carry))
        ended = len(data) == 0
        samples = decoder.samples(data, last=ended)
        if len(samples):
            yield samples
        if ended:
            return


def _read_up_to(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes: fewer only at the end of the stream (a pipe gives what it has)."""
    parts, got = [], 0
    while got < size:
        part = stream.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def microphone_chunks(step: float, device: str | int | None = None) -> Iterator[np.ndarray]:
    """The microphone (`device`: a PortAudio device name or number; None: the default) at 16 kHz, in chunks of
    at least `step` seconds: what arrived while the last update decoded. Opened now, so a missing library or
    device is an error before the stream starts.

    Raises:
        ValueError: no sounddevice or PortAudio (`MICROPHONE_NEEDS`), or no such input device.
    """
    try:
        import sounddevice
    except (ImportError, OSError):  # OSError: the package is there, the PortAudio library is not
        raise ValueError(MICROPHONE_NEEDS) from None
    arrived: queue.Queue[np.ndarray] = queue.Queue()
    try:
        stream = sounddevice.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32", device=device,
                                         callback=lambda data, frames, when, status: arrived.put(data[:, 0].copy()))
    except (ValueError, sounddevice.PortAudioError) as error:
        raise ValueError(f"cannot open the microphone {device if device is not None else '(default)'}: "
                         f"{str(error).splitlines()[0]}") from None
    return _microphone(stream, arrived, int(round(step * SAMPLE_RATE)))


def _microphone(stream, arrived: queue.Queue, size: int) -> Iterator[np.ndarray]:
    with stream:
        while True:
            chunks, total = [], 0
            while total < size:
                chunk = arrived.get()
                chunks.append(chunk)
                total += len(chunk)
            while not arrived.empty():
                chunks.append(arrived.get_nowait())
            yield np.concatenate(chunks)
