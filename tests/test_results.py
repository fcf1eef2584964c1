"""`Transcript` reads as openai-whisper's result dictionary too: the keys of `to_dict()`, nothing else."""

import json

import pytest

from asr.results import Segment, Transcript, TranscriptionStats, Word


def _transcript(language_probs=None) -> Transcript:
    segment = Segment(id=0, seek=0, start=0.0, end=1.5, text=" Hello there.", tokens=[1, 2, 3], temperature=0.0,
                      avg_logprob=-0.2, compression_ratio=1.1, no_speech_prob=0.01,
                      words=[Word(" Hello", 0.0, 0.6, 0.9), Word(" there.", 0.6, 1.5, 0.8)])
    return Transcript(text=" Hello there.", language="en", segments=[segment], stats=TranscriptionStats(),
                      language_probs=language_probs)


def test_subscripting_gives_the_fields_as_to_dict_does():
    t = _transcript()
    assert t["text"] == t.text and t["language"] == "en"
    assert t["segments"] == [t.segments[0].to_dict()] and t["segments"][0]["text"] == " Hello there."
    assert isinstance(t["segments"][0], dict) and t["segments"][0]["words"][0]["word"] == " Hello"
    assert t["stats"] == t.stats.to_dict()
    assert t.keys() == ["text", "language", "segments", "stats"] and dict(t) == t.to_dict()
    assert "text" in t and "language_probs" not in t
    json.dumps(t.to_dict())  # the JSON output's dictionary


def test_language_probs_only_when_detected():
    t = _transcript({"de": 0.1, "en": 0.9})
    assert t.keys()[-1] == "language_probs" and list(t["language_probs"]) == ["en", "de"]
    assert t.to_dict()["language_probs"] == t["language_probs"]
    with pytest.raises(KeyError):
        _transcript()["language_probs"]


@pytest.mark.parametrize("key", ["txt", "Text", "words", 0])
def test_unknown_keys_raise_key_error(key):
    with pytest.raises(KeyError):
        _transcript()[key]
