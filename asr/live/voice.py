"""Speech detection for a live stream (`--vad`): Silero VAD scores each 32 ms frame as audio arrives, so the
stream skips silence (no re-decode, nothing invented, a buffer that stays small) and ends an utterance at a
pause instead of waiting for two hypotheses to agree on its last words."""

from __future__ import annotations

import numpy as np

from audio.constants import SAMPLE_RATE
from audio.vad import FRAME_SAMPLES, VadOptions, speech_probabilities

# A stream's pause is shorter than a recording's (faster-whisper's 2 s would hold each sentence's last words
# back for 2 s); whisper_streaming's VAD controller ends speech after 500 ms too.
STREAM_VAD = VadOptions(min_silence_duration_ms=500, speech_pad_ms=300)
# Frames of earlier audio scored again before new ones: the model is recurrent, and its state after half a
# second of context is what it would have been after the whole stream, near enough.
CONTEXT_FRAMES = 16


class VoiceActivity:
    """Where speech starts and ends in a stream, from the frames scored so far (Silero VAD's hysteresis:
    speech begins at a frame at or above `threshold`, and ends once frames below `neg_threshold` have lasted
    `min_silence_duration_ms`).

    Attributes:
        speaking: whether the last scored frame is inside speech.
        speech_start: the stream sample where the current (or last) speech began; None before any speech.
        speech_end: the stream sample where the last speech ended; None while speaking or before any speech.
        scored: samples scored so far (whole frames).
    """

    def __init__(self, options: VadOptions = STREAM_VAD) -> None:
        self.options = options
        self.negative = options.neg_threshold if options.neg_threshold is not None else max(
            options.threshold - 0.15, 0.01)
        self.min_silence_frames = max(1, round(options.min_silence_duration_ms * SAMPLE_RATE / 1000 / FRAME_SAMPLES))
        self.speaking = False
        self.speech_start: int | None = None
        self.speech_end: int | None = None
        self.scored = 0
        self._pending = np.zeros(0, dtype=np.float32)  # samples short of a whole frame
        self._context = np.zeros(0, dtype=np.float32)  # the last CONTEXT_FRAMES frames scored
        self._quiet_since: int | None = None  # the first frame of the silence that may end the speech

    @property
    def pad(self) -> float:
        """Seconds of audio kept on each side of speech."""
        return self.options.speech_pad_ms / 1000

    def add(self, samples: np.ndarray) -> None:
        """Scores the whole frames that `samples` complete."""
        data = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = len(data) - len(data) % FRAME_SAMPLES
        self._pending = data[whole:]
        if whole == 0:
            return
        scored = np.concatenate([self._context, data[:whole]])
        probabilities = speech_probabilities(scored)
        self._context = scored[-CONTEXT_FRAMES * FRAME_SAMPLES:]
        first = self.scored // FRAME_SAMPLES
        for i, probability in enumerate(probabilities[-(whole // FRAME_SAMPLES):]):
            self._frame(first + i, float(probability))
        self.scored += whole

    def _frame(self, index: int, probability: float) -> None:
        if probability >= self.options.threshold:
            self._quiet_since = None
            if not self.speaking:
                self.speaking, self.speech_start, self.speech_end = True, index * FRAME_SAMPLES, None
            return
        if not self.speaking or probability >= self.negative:
            return
        if self._quiet_since is None:
            self._quiet_since = index
        if index + 1 - self._quiet_since >= self.min_silence_frames:
            self.speaking, self.speech_end, self._quiet_since = False, self._quiet_since * FRAME_SAMPLES, None
