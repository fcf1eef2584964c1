"""One audio's progress through the sequential algorithm (`_Item`): its windows (clips and silence skipped),
its previous text, its segments."""

from __future__ import annotations

import logging
import time

import numpy as np

from asr.chunks import SpeechMap
from asr.options import TranscribeOptions, seek_clips
from asr.results import Segment, Transcript, TranscriptionStats
from audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from audio.vad import speech_regions

logger = logging.getLogger(__name__)


def sequential_item(index: int, samples: np.ndarray, language: str | None, options: TranscribeOptions,
                     initial: list[int]) -> _Item:
    """An audio's item for the sequential algorithm: all of it, or with `options.vad` its speech only."""
    if options.vad is None:
        return _Item(index, samples, language, options, initial)
    start = time.perf_counter()
    speech_map = SpeechMap(speech_regions(samples, options.vad))
    item = _Item(index, speech_map.speech(samples), language, options, initial, speech_map)
    item.start = start
    item.stats.audio_seconds = len(samples) / SAMPLE_RATE
    item.stats.vad_seconds = time.perf_counter() - start
    logger.info("VAD: %.1f s of speech in %.1f s", len(item.samples) / SAMPLE_RATE, item.stats.audio_seconds)
    return item


class _Item:
    """One audio's progress through the sequential algorithm."""

    def __init__(self, index: int, samples: np.ndarray, language: str | None, options: TranscribeOptions,
                 initial_prompt: list[int], speech_map: SpeechMap | None = None) -> None:
        self.index = index
        self.start = time.perf_counter()
        # With VAD, `samples` is the speech only; the map gives times in the recording.
        self.speech_map = speech_map
        self.samples = samples
        self.options = options
        self.language = language
        self.language_probs: dict[str, float] | None = None
        self.stats = TranscriptionStats(audio_seconds=len(samples) / SAMPLE_RATE)
        self.content_frames = len(samples) // HOP_LENGTH
        self.seek = 0
        self.segment_size = 0
        self.segments: list[Segment] = []
        self.all_tokens: list[int] = list(initial_prompt)  # the initial prompt conditions the first window
        self.prompt_reset_since = 0
        self.finished_at: float | None = None
        # Further options: the initial prompt (carried), clips, the first window's prefix, the language of the
        # current window (multilingual), the last word's end (hallucination check), segments moved to the
        # recording's time so far (VAD).
        self.initial_prompt = list(initial_prompt)
        self.clips = seek_clips(options.clip_timestamps, self.content_frames)
        self.clip_index = 0
        self.prefix_pending = True
        self.window_language: str | None = language
        self.last_speech_timestamp = 0.0
        self.restored = 0
        self._floors: dict[int, float | None] = {}

    def floor(self, n_mels: int) -> float | None:
        """The floor of this audio's features (`audio.recording_floor`), computed once: its windows are
        normalised as openai-whisper normalises the whole file's spectrogram."""
        if n_mels not in self._floors:
            from audio.features import recording_floor

            self._floors[n_mels] = recording_floor(self.samples, n_mels)
        return self._floors[n_mels]

    @property
    def done_seconds(self) -> float:
        done = min(self.seek, self.content_frames) * HOP_LENGTH / SAMPLE_RATE
        if self.speech_map is not None:
            return self.stats.audio_seconds if self.seek >= self.content_frames else self.speech_map.original_time(done)
        return done

    @property
    def window(self) -> np.ndarray:
        end = self.seek * HOP_LENGTH + N_SAMPLES
        if self.options.clip_timestamps:  # openai-whisper: no audio past the clip's end
            end = min(end, self.clips[self.clip_index][1] * HOP_LENGTH)
        return self.samples[self.seek * HOP_LENGTH: end]

    def next_window(self) -> bool:
        """Moves to the next window worth decoding (silent ones are skipped); False when the audio is done."""
        while self.clip_index < len(self.clips):
            clip_start, clip_end = self.clips[self.clip_index]
            self.seek = max(self.seek, clip_start)
            if self.seek >= clip_end:
                self.clip_index += 1
                continue
            self.segment_size = min(N_FRAMES, self.content_frames - self.seek, clip_end - self.seek)
            if not _is_silent(self.window[: self.segment_size * HOP_LENGTH], self.options.silence_threshold_db):
                return True
            self.seek += self.segment_size
        self.seek = max(self.seek, self.content_frames)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
        return False

    def previous(self, bundle) -> list[int]:
        if self.options.carry_initial_prompt:
            # openai-whisper: the initial prompt, then as much of the text since it (and since a reset) as fits.
            room = bundle.model.config.max_target_positions // 2 - 1 - len(self.initial_prompt)
            since = self.all_tokens[max(len(self.initial_prompt), self.prompt_reset_since):]
            return previous_text(self.initial_prompt + (since[-room:] if room > 0 else []), bundle)
        return previous_text(self.all_tokens[self.prompt_reset_since:], bundle)

    def restore_new(self) -> list[Segment]:
        """The segments added since the last call, in the recording's time (VAD maps them back)."""
        new = self.segments[self.restored:]
        if self.speech_map is not None:
            self.speech_map.restore(new)
        self.restored = len(self.segments)
        return new

    def consume(self, segments: list[Segment], advance: int, temperature: float) -> None:
        for segment in segments:
            segment.id = len(self.segments)
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
        if not self.options.condition_on_previous_text or temperature > 0.5:
            # A hot fallback means the previous text may be off; don't let it steer the next window.
            self.prompt_reset_since = len(self.all_tokens)
        self.seek += advance

    def transcript(self) -> Transcript:
        if self.speech_map is not None:
            self.restore_new()
            self.speech_map = None
        self.stats.total_seconds = (self.finished_at or time.perf_counter()) - self.start
        text = "".join(segment.text for segment in self.segments)
        return Transcript(text, self.language or "en", self.segments, self.stats, self.language_probs)


def _is_silent(samples: np.ndarray, threshold_db: float | None) -> bool:
    """True when the samples never reach `threshold_db` dBFS."""
    if threshold_db is None or samples.size == 0:
        return threshold_db is not None
    return float(np.abs(samples).max()) < 10.0 ** (threshold_db / 20.0)


def previous_text(tokens: list[int], bundle) -> list[int]:
    """The tail of the previous text that fits in the prompt: half the decoder context (openai-whisper's limit)."""
    return tokens[-(bundle.model.config.max_target_positions // 2 - 1):] if tokens else []
