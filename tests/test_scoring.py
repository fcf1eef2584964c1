"""Scoring edge cases: what `asr eval` counts when a reference is empty."""

from __future__ import annotations

from eval.wer import error_counts


def test_words_invented_on_an_empty_reference_are_insertions() -> None:
    # Silence with text written into it is an error; it used to be dropped from the set.
    counts = error_counts(["the cat sat", ""], ["the cat sat", "thank you for watching"])
    assert (counts.substitutions, counts.deletions, counts.insertions, counts.reference_length) == (0, 0, 4, 3)
    assert counts.rate == 4 / 3


def test_an_empty_reference_and_an_empty_hypothesis_are_no_error() -> None:
    counts = error_counts(["", "  "], ["", ""])
    assert counts.insertions == 0 and counts.rate == 0.0


def test_character_languages_count_invented_characters() -> None:
    counts = error_counts([""], ["你好"], language="zh")
    assert counts.insertions == 2 and counts.reference_length == 0
