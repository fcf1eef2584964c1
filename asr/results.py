"""Results of a transcription: segments, text, language and statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from decoding.stats import GenerationStats


@dataclass
class Word:
    """One word with its time span (seconds) and the model's probability for it."""

    word: str
    start: float
    end: float
    probability: float


@dataclass
class Segment:
    """A stretch of speech, with openai-whisper's fields."""

    id: int
    # Start of the 30 s window the segment was decoded in, in frames of 10 ms.
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None
    # The window's detected language, with multilingual detection (None otherwise).
    language: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.words is None:
            del data["words"]
        if self.language is None:
            del data["language"]
        return data


@dataclass
class TranscriptionStats:
    """Where the time went, and what the model and the assistant did."""

    generation: GenerationStats = field(default_factory=GenerationStats)
    # The assistant that drafted (its --assistant name: `base-draft:int8`, ...), or none.
    assistant: str = "none"
    # Length of the audio, and the number of 30 s windows decoded (temperature fallbacks count once).
    audio_seconds: float = 0.0
    windows: int = 0
    # Voice activity detection, encoder passes (model and assistant), decoding, and the whole call, feature
    # extraction included.
    vad_seconds: float = 0.0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def rtf(self) -> float:
        """Real-time factor: processing time / audio time (lower is faster)."""
        return self.total_seconds / self.audio_seconds if self.audio_seconds else 0.0

    def add(self, other: "TranscriptionStats") -> None:
        """Accumulates another transcription's statistics into this one."""
        self.generation.add(other.generation)
        if other.assistant != "none":
            self.assistant = other.assistant
        for name in ("audio_seconds", "windows", "vad_seconds", "encode_seconds", "decode_seconds", "total_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        data = self.generation.to_dict()
        data.pop("total_seconds")
        data.update(
            assistant=self.assistant,
            audio_seconds=round(self.audio_seconds, 3),
            windows=self.windows,
            vad_seconds=round(self.vad_seconds, 4),
            encode_seconds=round(self.encode_seconds, 4),
            decode_seconds=round(self.decode_seconds, 4),
            total_seconds=round(self.total_seconds, 4),
            rtf=round(self.rtf, 4),
        )
        return data


@dataclass
class Transcript:
    """The result of `asr.transcribe`: the text, its language, the segments and what decoding cost.

    It also reads as openai-whisper's result dictionary: `result["text"]`, `result["segments"]` (as dicts),
    `result["language"]`, plus `result["stats"]` and, when the language was detected, `result["language_probs"]`;
    `keys()` lists them and `to_dict()` gives them all at once (the JSON output's dictionary).
    """

    text: str
    language: str
    segments: list[Segment]
    stats: TranscriptionStats
    # Probability of each language code when it was detected (None when given or English-only).
    language_probs: dict[str, float] | None = None

    def keys(self) -> list[str]:
        """The keys of `to_dict()`: text, language, segments, stats, and language_probs when it is known."""
        keys = ["text", "language", "segments", "stats"]
        return keys + ["language_probs"] if self.language_probs is not None else keys

    def __getitem__(self, key: str) -> Any:
        """`to_dict()[key]`, computing only that entry.

        Raises:
            KeyError: a key that `keys()` does not list.
        """
        if key not in self.keys():
            raise KeyError(f"{key!r} (a Transcript has {', '.join(self.keys())})")
        if key == "segments":
            return [s.to_dict() for s in self.segments]
        if key == "stats":
            return self.stats.to_dict()
        if key == "language_probs":
            return {code: round(p, 6) for code, p in sorted(self.language_probs.items(), key=lambda kv: -kv[1])}
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        """The keys, as a dictionary's (so `dict(result)` works)."""
        return iter(self.keys())

    def to_dict(self) -> dict[str, Any]:
        """The JSON output's dictionary: openai-whisper's result (text, segments as dicts, language) plus `stats`
        (tokens, forward passes, drafted and accepted tokens, timings) and `language_probs` when detected, highest
        first."""
        return {key: self[key] for key in self.keys()}
