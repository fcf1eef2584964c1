"""One text normaliser for references and hypotheses alike, before any scoring."""

from __future__ import annotations

from functools import lru_cache

# Languages scored by characters (no spaces between words).
CHARACTER_LANGUAGES = frozenset({"zh", "ja", "ko", "th", "lo", "my", "yue"})


@lru_cache(maxsize=1)
def _english():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


@lru_cache(maxsize=1)
def _basic():
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer()


def normalize(text: str, language: str = "en") -> str:
    """Whisper's English normaliser for English (spellings, numbers, fillers); the basic one otherwise."""
    normalizer = _english() if language == "en" else _basic()
    return " ".join(normalizer(text).split())


def normalizer_name(language: str) -> str:
    """Which normaliser and unit `language` is scored with, as the report names it."""
    name = "whisper-english" if language == "en" else "whisper-basic"
    return f"{name}, characters" if language in CHARACTER_LANGUAGES else f"{name}, words"
