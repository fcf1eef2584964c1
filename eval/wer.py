"""Word and character error rates with jiwer, after normalisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from eval.normalize import CHARACTER_LANGUAGES, normalize


@dataclass(frozen=True)
class ErrorCounts:
    """Edit operations between references and hypotheses, and the reference length."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_length: int = 0

    @property
    def rate(self) -> float:
        """(S + D + I) / N; 0 for an empty reference set (its insertions are counted, in `insertions`)."""
        errors = self.substitutions + self.deletions + self.insertions
        return errors / self.reference_length if self.reference_length else 0.0

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        return ErrorCounts(self.substitutions + other.substitutions, self.deletions + other.deletions,
                           self.insertions + other.insertions, self.reference_length + other.reference_length)


def error_counts(references: Sequence[str], hypotheses: Sequence[str], language: str = "en",
                 normalized: bool = False) -> ErrorCounts:
    """Counts word edits (character edits for zh/ja/ko...) after normalising both sides.

    A pair whose reference is empty (silence, music) counts every word of its hypothesis as an insertion: text
    invented where nobody speaks is an error, as it is in the rest of the set.

    Args:
        references, hypotheses: parallel texts.
        language: decides the normaliser and word or character scoring.
        normalized: the texts are normalised already.
    """
    import jiwer

    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not normalized:
        references = [normalize(r, language) for r in references]
        hypotheses = [normalize(h, language) for h in hypotheses]
    characters = language in CHARACTER_LANGUAGES
    invented = sum(len(h.replace(" ", "")) if characters else len(h.split())
                   for r, h in zip(references, hypotheses) if not r.strip())
    pairs = [(r, h) for r, h in zip(references, hypotheses) if r.strip()]
    if not pairs:
        return ErrorCounts(insertions=invented)
    refs, hyps = [p[0] for p in pairs], [p[1] for p in pairs]
    measure = jiwer.process_characters if characters else jiwer.process_words
    out = measure(refs, hyps)
    return ErrorCounts(out.substitutions, out.deletions, out.insertions + invented,
                       out.substitutions + out.deletions + out.hits)


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str], language: str = "en") -> float:
    """WER (or CER for character languages) after normalisation."""
    return error_counts(references, hypotheses, language).rate
