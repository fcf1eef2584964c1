"""The streaming transcriber: audio goes in as it arrives, committed segments come out.

Every update re-decodes the buffer (the audio since the last trim, at most a window) with the committed text
before it as the prompt. The words on which this hypothesis and the last one agree from the start
(LocalAgreement-2) are committed; the buffer is trimmed at the end of a committed Whisper segment once it
is longer than `trim_seconds`. With drafting on, each re-decode drafts the last hypothesis first: most of a
re-decode is then one verifying pass, and the words are the model's greedy words either way. With voice
activity detection, silence is not decoded at all and a pause commits the utterance before it whole.
"""

from __future__ import annotations

import contextlib
import logging
import time
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np

from asr.live.hypothesis import HypothesisAssistant, joined_windows, moved_reference, segment_boundaries
from asr.live.voice import VoiceActivity
from asr.options import TranscribeOptions
from asr.results import Segment, Transcript, TranscriptionStats, Word
from asr.whisper import alignment_kernels
from audio.constants import HOP_LENGTH, SAMPLE_RATE
from decoding.stats import GenerationStats

logger = logging.getLogger(__name__)

# Whisper reads at most 30 s at a time; a buffer that grows past this without a commit drops its start.
MAX_BUFFER_SECONDS = 30.0
# Committed text kept in the prompt (whisper_streaming keeps 200 characters).
PROMPT_CHARACTERS = 200
# An update decodes a second window only for this much audio after the first one's last complete segment: a
# shorter rest is in the next update's first window, without another encoder pass now.
SECOND_WINDOW_SECONDS = 2.0
# The last decode of a stream or an utterance leaves less: a rest under a second is at most a word, and decoded
# as a window of its own it came back as a hallucinated loop ("the world, the world, ...") in a real-time run
# on the sonnets with --vad (a stream has no temperature fallback to retry it).
LAST_REST_SECONDS = 1.0


@dataclass
class CommittedSegment:
    """Words committed together: their times in the stream and when they were committed."""

    start: float
    end: float
    text: str
    emitted_at: float  # seconds since the stream began (the stream's clock)
    words: list[Word]

    def to_dict(self) -> dict[str, Any]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text,
                "emitted_at": round(self.emitted_at, 3)}


@dataclass
class StreamStats:
    """What a stream cost: updates, compute against audio, the decoders' work, and commit latency."""

    assistant: str = "none"  # what drafted: "hypothesis", "hypothesis+<the run's assistant>", or none
    updates: int = 0
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0  # the decoder's passes and drafting, and the word-alignment pass
    repetitive_windows: int = 0  # decoded windows whose words were dropped as a loop (`_decode`)
    generation: GenerationStats = field(default_factory=GenerationStats)
    latencies: list[float] = field(default_factory=list)  # per committed word: commit time - its end in the audio

    def to_dict(self) -> dict[str, Any]:
        latency = np.array(self.latencies or [np.nan])
        data = {
            "assistant": self.assistant, "updates": self.updates, "audio_seconds": round(self.audio_seconds, 3),
            "compute_seconds": round(self.compute_seconds, 3),
            "compute_per_audio_second": round(self.compute_seconds / max(self.audio_seconds, 1e-9), 4),
            "encode_seconds": round(self.encode_seconds, 3), "decode_seconds": round(self.decode_seconds, 3),
            "decoder_seconds": round(self.generation.total_seconds, 3),
            "latency_mean": _rounded(np.mean(latency)), "latency_p50": _rounded(np.percentile(latency, 50)),
            "latency_p90": _rounded(np.percentile(latency, 90)), "committed_words": len(self.latencies),
            "repetitive_windows": self.repetitive_windows,
        }
        generation = self.generation.to_dict()
        generation.pop("total_seconds", None)
        return {**data, **generation}


def _rounded(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 3)


class StreamingTranscriber:
    """Transcribes a stream: `insert_audio` what arrived, `process` to update, `finish` at the end.

    Args:
        bundle: a loaded model.
        options: transcription options (language, task, prompt...); the stream decodes greedily at temperature
            0 with word timestamps, whatever they say (a sampled fallback would make hypotheses disagree).
        assistant: drafts the new audio at the end of each buffer, after the last hypothesis
            (`asr.assist.choose.make_assistant`), or None; one `auto` chose for files only (`for_streams` False)
            is left out.
        drafting: whether each update drafts the last hypothesis (and the assistant) at all; False: plain
            re-decodes, the same words (for comparison).
        trim_seconds: a buffer longer than this is cut at the end of its last committed segment.
        clock: seconds since the stream began, for `emitted_at` (default: the audio received so far, which makes
            a run deterministic; pass a wall clock for live audio).
        voice: voice activity detection (`asr.live.voice.VoiceActivity`), or None to decode everything: with it,
            updates in silence decode nothing and keep only a pad of audio, and the end of speech commits the
            utterance whole.
    """

    def __init__(self, bundle, options: TranscribeOptions = TranscribeOptions(), assistant=None, *,
                 drafting: bool = True, trim_seconds: float = 15.0, clock: Callable[[], float] | None = None,
                 voice: VoiceActivity | None = None) -> None:
        from asr.transcription import Transcriber

        if not 1.0 <= trim_seconds <= MAX_BUFFER_SECONDS - 1:
            raise ValueError(f"trim seconds must be from 1 to {MAX_BUFFER_SECONDS - 1:g}, got {trim_seconds:g}")
        self.bundle = bundle
        self.options = replace(options, temperatures=(0.0,), word_timestamps=True, timestamps=True,
                               condition_on_previous_text=True, batch_size=None, vad=None, clip_timestamps=())
        Transcriber(bundle, self.options, None)  # the options' checks, once, before any audio
        alignment_kernels.load()  # every update aligns its words: no update pays for loading the compiled loops
        if drafting and assistant is not None and not getattr(assistant, "for_streams", True):
            # The shipped draft `auto` picks on a CPU for files (`asr.assist.choose`): in a stream it costs more
            # than it saves, so the last hypothesis drafts alone. A draft named with --assistant drafts as asked.
            logger.info("--assistant auto: %s does not pay in a stream on a CPU; drafting from the last "
                        "hypothesis alone", assistant.name)
            assistant = None
        self.assistant = assistant
        self.drafting = drafting
        self.trim_seconds = trim_seconds
        self.voice = voice
        self.clock = clock or (lambda: self.received / SAMPLE_RATE)
        self.language = self.options.language
        self.stats = StreamStats(assistant="none" if not drafting else "hypothesis" if assistant is None
                                 else f"hypothesis+{assistant.name}")
        self.committed: list[CommittedSegment] = []
        self.received = 0  # samples inserted so far
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0.0  # the buffer's first sample, in seconds of the stream
        self._hypothesis: list[Word] = []  # the last hypothesis's words after the committed ones
        self._committed_words: list[Word] = []
        self._committed_end = 0.0
        self._reference: list[int] = []  # the last decode's tokens, for the buffer as it starts now
        self._decoded_through = 0  # samples received when the buffer was last decoded

    # --- input ---------------------------------------------------------------------------------------------

    def insert_audio(self, samples: np.ndarray) -> None:
        """Appends 16 kHz mono float32 samples to the buffer."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._buffer = np.concatenate([self._buffer, samples])
        self.received += len(samples)
        self.stats.audio_seconds = self.received / SAMPLE_RATE
        if self.voice is not None:
            started = time.perf_counter()
            self.voice.add(samples)
            self.stats.compute_seconds += time.perf_counter() - started

    # --- updates -------------------------------------------------------------------------------------------

    def process(self) -> list[CommittedSegment]:
        """Re-decodes the buffer; returns what this update committed (possibly nothing)."""
        if self.voice is not None and not self.voice.speaking:
            return self._after_speech()
        forced = self._fit_window()
        words, segments_end = self._decode()
        new = self._after_committed(words)
        agreed = []
        while new and self._hypothesis and _same(new[0], self._hypothesis[0]):
            agreed.append(new.pop(0))
            self._hypothesis.pop(0)
        self._hypothesis = new
        committed = forced + self._commit(agreed)
        self._trim(segments_end)
        return committed

    def finish(self) -> list[CommittedSegment]:
        """Decodes what is left and commits all of it (the stream ended)."""
        if self.voice is not None and not self.voice.speaking:
            return self._after_speech()
        if len(self._buffer) == 0 or self._decoded_through == self.received:  # the last update saw it all
            words, self._hypothesis = self._hypothesis, []
            return self._commit(words)
        forced = self._fit_window()
        words, _ = self._decode(whole=True)
        self._hypothesis = []
        return forced + self._commit(self._after_committed(words))

    @property
    def pending_text(self) -> str:
        """The last hypothesis's words that are not committed yet (what a display shows as tentative)."""
        return "".join(w.word for w in self._hypothesis).strip()

    def transcript(self) -> Transcript:
        """What was committed, as a `Transcript` (for the writers: txt, srt, vtt, json)."""
        segments = [Segment(id=i, seek=0, start=c.start, end=c.end, text=c.text, tokens=[], temperature=0.0,
                            avg_logprob=0.0, compression_ratio=0.0, no_speech_prob=0.0, words=c.words)
                    for i, c in enumerate(self.committed)]
        stats = TranscriptionStats(generation=self.stats.generation, assistant=self.stats.assistant,
                                   audio_seconds=self.stats.audio_seconds, windows=self.stats.updates,
                                   encode_seconds=self.stats.encode_seconds, decode_seconds=self.stats.decode_seconds,
                                   total_seconds=self.stats.compute_seconds)
        return Transcript(text="".join(c.text for c in self.committed), language=self.language or "",
                          segments=segments, stats=stats)

    # --- inside --------------------------------------------------------------------------------------------

    def _after_speech(self) -> list[CommittedSegment]:
        """An update where the voice detector hears no speech: a buffer that holds the end of the last speech is
        decoded through it (and its pad) and all of it committed; then, and in silence, only the last pad of
        audio is kept (speech may start in it)."""
        end = self.voice.speech_end
        committed = []
        if end is not None and end / SAMPLE_RATE > self._buffer_start:
            committed = self._fit_window()
            through = min(len(self._buffer),
                          int(round((end / SAMPLE_RATE + self.voice.pad - self._buffer_start) * SAMPLE_RATE)))
            words, _ = self._decode(through, whole=True)
            committed += self._commit(self._after_committed(words))
            self._hypothesis, self._reference = [], []
            self._cut(self._buffer_start + through / SAMPLE_RATE)
        keep = self.voice.pad + 1 / SAMPLE_RATE
        if len(self._buffer) / SAMPLE_RATE > keep:
            self._hypothesis, self._reference = [], []
            self._cut(self._buffer_start + len(self._buffer) / SAMPLE_RATE - keep)
        return committed

    def _decode(self, samples: int | None = None, whole: bool = False) -> tuple[list[Word], list[float]]:
        """One decode of the buffer (its first `samples`; None: all of it): its words in stream time, and the
        stream times at which its segments end. An update leaves a short rest after its windows for the next
        update (`SECOND_WINDOW_SECONDS`); the last decode of an utterance (`whole`) all but a second at most."""
        from asr.transcription import Transcriber

        started = time.perf_counter()
        self._decoded_through = self.received
        prompt = "".join(w.word for w in self._committed_words_before_buffer())[-PROMPT_CHARACTERS:].strip()
        user_prompt = self.options.initial_prompt
        options = replace(self.options, language=self.language,
                          initial_prompt=" ".join(p for p in (user_prompt, prompt) if p) or None)
        assistant = None
        if self.drafting:
            inner_k = (getattr(self.assistant, "schedule", None) or ("heuristic", 5))[1]
            assistant = HypothesisAssistant(self._reference, self.assistant, inner_k)
        windows: list[list[int]] = []
        with _without_fallback_warnings():
            transcriber = Transcriber(self.bundle, options, assistant, lambda window: windows.append(window.tokens))
            buffer = self._buffer[:samples]
            transcript = transcriber.leading_windows(buffer, LAST_REST_SECONDS if whole else SECOND_WINDOW_SECONDS)
        if self.language is None:
            self.language = transcript.language  # one language for the whole stream, as detected first
        seeks = sorted({s.seek * HOP_LENGTH / SAMPLE_RATE for s in transcript.segments})
        if len(seeks) != len(windows):  # a window without segments: where the next one starts is not known
            windows, seeks = windows[:1], [0.0]
        self._reference = joined_windows(windows, seeks, self.bundle.special.timestamp_begin)
        stats = transcript.stats
        self.stats.updates += 1
        self.stats.generation.add(stats.generation)
        self.stats.encode_seconds += stats.encode_seconds
        self.stats.decode_seconds += stats.decode_seconds
        self.stats.compute_seconds += time.perf_counter() - started
        offset = self._buffer_start
        # A window that fails the repetition check (`--compression-ratio-threshold`) is a loop that a file's
        # decoding would sample again; a stream has no fallback, and two updates that loop alike would commit it
        # (a real-time run once committed 250 invented words on the sonnets). Its words are not heard: a later
        # update that decodes that audio without a loop gives them.
        limit = self.options.compression_ratio_threshold
        kept = [s for s in transcript.segments if limit is None or s.compression_ratio <= limit]
        self.stats.repetitive_windows += len({s.seek for s in transcript.segments} - {s.seek for s in kept})
        words = [Word(w.word, w.start + offset, w.end + offset, w.probability) for s in kept for w in (s.words or ())]
        timestamp_begin = self.bundle.special.timestamp_begin
        ends = [offset + (self._reference[j] - timestamp_begin) * 0.02
                for j in segment_boundaries(self._reference, timestamp_begin)]
        return words, ends

    def _committed_words_before_buffer(self) -> list[Word]:
        return [w for w in self._committed_words if w.end <= self._buffer_start + 0.01]

    def _after_committed(self, words: list[Word]) -> list[Word]:
        """The hypothesis's words that are not committed yet: those after the committed text's last words where
        the hypothesis says them again (ending within a second of the committed end); else those that start
        after the committed end, less a repeat of the committed text's last words at their head
        (whisper_streaming's rules). Times alone lose the word after a committed word whose span was drawn too
        long: "significantly", committed over 62.34-63.34 s before the next word was heard, hid "reduced" (from
        63.14 s) from every later update."""
        tail = [_key(w) for w in self._committed_words[-5:]]
        keys = [_key(w) for w in words]
        for n in range(len(tail), 0, -1):
            found = [i + n for i in range(len(keys) - n + 1) if keys[i:i + n] == tail[-n:]
                     and abs(words[i + n - 1].end - self._committed_end) < 1.0]
            if found:
                return words[min(found, key=lambda at: abs(words[at - 1].end - self._committed_end)):]
        new = [w for w in words if w.start > self._committed_end - 0.1]
        while new and min(new[0].end, self._committed_end) - new[0].start > 0.5 * (new[0].end - new[0].start):
            new.pop(0)  # mostly within the committed last word: its tail heard again, after a cut inside it
        if new and self._committed_words and abs(new[0].start - self._committed_end) < 1.0:
            for n in range(min(len(tail), len(new)), 0, -1):
                if tail[-n:] == [_key(w) for w in new[:n]]:
                    return new[n:]
        return new

    def _commit(self, words: list[Word]) -> list[CommittedSegment]:
        words = [w for w in words if w.word.strip()]
        if not words:
            return []
        now = self.clock()
        segment = CommittedSegment(words[0].start, words[-1].end, "".join(w.word for w in words), now, words)
        self.committed.append(segment)
        self._committed_words.extend(words)
        self._committed_end = words[-1].end
        self.stats.latencies.extend(now - w.end for w in words)
        return [segment]

    def _trim(self, segment_ends: list[float]) -> None:
        """Cuts a long buffer at the last segment end within the committed text, or, where speech runs on
        without one, at the committed text's end (its last word's end: the next decode starts after it)."""
        if len(self._buffer) / SAMPLE_RATE <= self.trim_seconds:
            return
        done = [end for end in segment_ends if self._buffer_start < end <= self._committed_end + 0.01]
        if done:
            self._cut(done[-1])
        elif self._committed_end > self._buffer_start + 1.0:
            self._cut(self._committed_end)

    def _fit_window(self) -> list[CommittedSegment]:
        """Keeps the buffer within one window before it is decoded (a second window would cost a second encoder
        pass, and fall further behind): its start goes, and the words last heard there are committed as heard,
        since no later hypothesis can agree on them (text that never settles, or speech with no pause)."""
        length = len(self._buffer) / SAMPLE_RATE
        if length <= MAX_BUFFER_SECONDS - 0.5:
            return []
        cut = self._buffer_start + length - self.trim_seconds
        heard = [w for w in self._hypothesis if w.end <= cut]
        self._hypothesis = [w for w in self._hypothesis if w.end > cut]
        committed = self._commit(heard)
        self._cut(cut)
        return committed

    def _cut(self, cut: float) -> None:
        relative = cut - self._buffer_start
        self._reference = moved_reference(self._reference, relative, self.bundle.special.timestamp_begin)
        self._buffer = self._buffer[int(round(relative * SAMPLE_RATE)):]
        self._buffer_start = cut


@contextlib.contextmanager
def _without_fallback_warnings() -> Iterator[None]:
    """A stream decodes at temperature 0 alone: a window that fails the fallback checks is no news there."""
    decoder_logger = logging.getLogger("asr.window_decoder")

    def keep(record: logging.LogRecord) -> bool:
        return "failed the fallback checks" not in record.getMessage()

    decoder_logger.addFilter(keep)
    try:
        yield
    finally:
        decoder_logger.removeFilter(keep)


def _key(word: Word) -> str:
    """A word as two hypotheses are compared: without the punctuation around it and case-folded. A word at the
    buffer's end often ends a sentence ("use.") that the next update, hearing more, continues ("use, and"):
    compared as written, the whole tail after it waited one more update (the stepped sonnets, int8, AMD EPYC:
    latency 2.04 s mean, 3.23 s p90 as written; 1.75 s and 2.56 s so). The newer hypothesis's form is committed."""
    text = word.word.strip()
    start, end = 0, len(text)
    while start < end and unicodedata.category(text[start]).startswith("P"):
        start += 1
    while end > start and unicodedata.category(text[end - 1]).startswith("P"):
        end -= 1
    return text[start:end].casefold()


def _same(a: Word, b: Word) -> bool:
    return _key(a) == _key(b)
