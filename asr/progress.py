"""One recording's state on its way through the windows (`AudioProgress`), and on the batched path each speech
chunk's (`ChunkProgress`) and the recording they belong to (`ChunkedRecording`): where decoding is, the previous
text, the segments and the statistics (`asr.transcription` moves them on)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from asr.options import TranscribeOptions, seek_clips
from asr.results import Segment, Transcript, TranscriptionStats
from asr.speech import Chunk, SpeechMap, shift_segments
from audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from audio.features import margins, recording_floor


class AudioProgress:
    """One audio's progress through its windows: where it is (clips and silence skipped), its previous text, its
    segments and statistics."""

    # With word timestamps, the next window starts at the last word's end (openai-whisper's loop).
    resumes_at_last_word = True

    def __init__(self, index: int, samples: np.ndarray, language: str | None, options: TranscribeOptions,
                 initial_prompt: list[int], speech_map: SpeechMap | None = None, name: str | None = None) -> None:
        self.index = index  # position among the audios of the run
        self.name = name  # the file's name, for messages
        self.start = time.perf_counter()
        # With VAD, `samples` is the speech only; the map gives times in the recording.
        self.speech_map = speech_map
        self.samples = samples
        self.options = options
        self.language = language
        self.language_probs: dict[str, float] | None = None
        self.stats = TranscriptionStats(audio_seconds=len(samples) / SAMPLE_RATE)
        self.content_frames = len(samples) // HOP_LENGTH
        # The current window: its first mel frame, and its length in frames.
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
        if self.seek == 0 and len(self.window) == len(self.samples):
            return None  # the window holds the whole recording: its own floor is the recording's
        if n_mels not in self._floors:
            self._floors[n_mels] = recording_floor(self.samples, n_mels)
        return self._floors[n_mels]

    @property
    def done_seconds(self) -> float:
        """How far decoding has come, in the recording's time."""
        done = min(self.seek, self.content_frames) * HOP_LENGTH / SAMPLE_RATE
        if self.speech_map is not None:
            return self.stats.audio_seconds if self.seek >= self.content_frames else self.speech_map.original_time(done)
        return done

    @property
    def window(self) -> np.ndarray:
        """The current window's samples (at most 30 s; none past the clip's end)."""
        end = self.seek * HOP_LENGTH + N_SAMPLES
        if self.options.clip_timestamps:  # openai-whisper: no audio past the clip's end
            end = min(end, self.clips[self.clip_index][1] * HOP_LENGTH)
        return self.samples[self.seek * HOP_LENGTH: end]

    @property
    def window_margins(self) -> tuple[np.ndarray, np.ndarray]:
        """The recording's samples just around the current window, which its edge frames reach into."""
        start = self.seek * HOP_LENGTH
        return margins(self.samples, start, start + len(self.window))

    def next_window(self) -> bool:
        """Moves to the next window worth decoding (silent ones are skipped); False when the audio is done."""
        while self.clip_index < len(self.clips):
            clip_start, clip_end = self.clips[self.clip_index]
            self.seek = max(self.seek, clip_start)
            if self.seek >= clip_end:
                self.clip_index += 1
                if self.clip_index < len(self.clips):
                    # openai-whisper: the next clip starts at its own start, even where the last window's
                    # timestamps reached past it.
                    self.seek = self.clips[self.clip_index][0]
                continue
            self.segment_size = min(N_FRAMES, self.content_frames - self.seek, clip_end - self.seek)
            if not is_silent(self.window[: self.segment_size * HOP_LENGTH], self.options.silence_threshold_db):
                return True
            self.seek += self.segment_size
        self.seek = max(self.seek, self.content_frames)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
        return False

    def previous(self, room: int) -> list[int]:
        """The previous text for the next window's prompt: its latest `room` tokens (`asr.options.prompt_room`)."""
        if self.options.carry_initial_prompt:
            # openai-whisper: the initial prompt, then as much of the text since it (and since a reset) as fits.
            left = room - len(self.initial_prompt)
            since = self.all_tokens[max(len(self.initial_prompt), self.prompt_reset_since):]
            tokens = self.initial_prompt + (since[-left:] if left > 0 else [])
        else:
            tokens = self.all_tokens[self.prompt_reset_since:]
        return tokens[-room:] if tokens else []

    def consume(self, segments: list[Segment], advance: int, temperature: float) -> None:
        """Adds a window's segments and moves `advance` mel frames on."""
        for segment in segments:
            segment.id = len(self.segments)
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
        if not self.options.condition_on_previous_text or temperature > 0.5:
            # A hot fallback means the previous text may be off; don't let it steer the next window.
            self.prompt_reset_since = len(self.all_tokens)
        self.seek += advance

    def take_new_segments(self) -> list[Segment]:
        """The segments added since the last call, in the recording's time (VAD maps them back)."""
        new = self.segments[self.restored:]
        if self.speech_map is not None:
            self.speech_map.restore(new)
        self.restored = len(self.segments)
        return new

    def transcript(self) -> Transcript:
        if self.speech_map is not None:
            self.take_new_segments()
            self.speech_map = None
        return transcript_of(self.segments, self.language, self.stats, self.language_probs, self.start,
                           self.finished_at)


class ChunkProgress(AudioProgress):
    """A speech chunk as an audio of its own: its own samples, and no text from other chunks.

    Text carried from one chunk to the next would make the chunks sequential again (faster-whisper and
    WhisperX decode each chunk alone too).
    """

    # A chunk is decoded as one window, as faster-whisper's batched pipeline decodes it, word timestamps or not.
    resumes_at_last_word = False

    def __init__(self, recording: ChunkedRecording, chunk_index: int, chunk: Chunk, options: TranscribeOptions,
                 initial_prompt: list[int]) -> None:
        super().__init__(recording.index, recording.samples[chunk.start:chunk.end], recording.language, options,
                         initial_prompt)
        self.recording, self.chunk_index, self.chunk = recording, chunk_index, chunk
        self.prefix_pending = chunk_index == 0  # the prefix starts the recording's first window only


@dataclass
class ChunkedRecording:
    """One recording on the batched path: its chunks' segments as they are decoded."""

    index: int  # position among the audios of the run
    samples: np.ndarray
    language: str | None
    start: float = field(default_factory=time.perf_counter)
    language_probs: dict[str, float] | None = None
    stats: TranscriptionStats = field(default_factory=TranscriptionStats)
    # Per chunk, in order: its segments in the recording's time (None until it is decoded).
    results: list[list[Segment] | None] = field(default_factory=list)
    finished_at: float | None = None

    def add(self, chunk: ChunkProgress) -> None:
        """Takes a decoded chunk's segments (moved to the recording's time) and statistics."""
        shift_segments(chunk.segments, chunk.chunk)
        self.results[chunk.chunk_index] = chunk.segments
        chunk.stats.audio_seconds = chunk.stats.total_seconds = 0.0  # the recording's own are set at its end
        self.stats.add(chunk.stats)
        if all(result is not None for result in self.results):
            self.finished_at = time.perf_counter()

    def transcript(self) -> Transcript:
        segments = [segment for result in self.results for segment in result or []]
        for index, segment in enumerate(segments):
            segment.id = index
        self.stats.audio_seconds = len(self.samples) / SAMPLE_RATE
        return transcript_of(segments, self.language, self.stats, self.language_probs, self.start, self.finished_at)


def transcript_of(segments: list[Segment], language: str | None, stats: TranscriptionStats,
                  language_probs: dict[str, float] | None, start: float, finished_at: float | None) -> Transcript:
    """The transcript of an audio's segments; its time runs from `start` to when it finished (else now)."""
    stats.total_seconds = (finished_at or time.perf_counter()) - start
    return Transcript("".join(segment.text for segment in segments), language or "en", segments, stats, language_probs)


def is_silent(samples: np.ndarray, threshold_db: float | None) -> bool:
    """True when the samples never reach `threshold_db` dBFS."""
    if threshold_db is None or samples.size == 0:
        return threshold_db is not None
    return float(np.abs(samples).max()) < 10.0 ** (threshold_db / 20.0)
