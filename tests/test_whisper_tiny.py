"""Transcription on tiny Whisper models made here (no downloaded weights): assisted decoding gives the model's own
tokens on the Whisper path, the temperature fallback really retries, and silent windows are skipped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from asr.assist.choose import make_assistant
from asr.transcription import DecodedWindow, transcribe, transcribe_many
from asr.models.precision import resolve_precision
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from audio import SAMPLE_RATE, load_audio
from tests.conftest import SAMPLES, SCRIPTED_TEXT, TIMESTAMP_BEGIN
from tests.test_precision import EXACT

pytestmark = pytest.mark.usefixtures("one_thread")

# Greedy only: a random model fails every fallback check, and 40 tokens a window keep it quick.
GREEDY = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40)
WITH_WORDS = dataclasses.replace(GREEDY, word_timestamps=True)


def synthetic(seed: int) -> np.ndarray:
    """Noise over a tone: 6 to 13 s, or 35 s (two windows, the second conditioned on the first) when seed % 4 == 3."""
    rng = np.random.default_rng(seed)
    seconds = 35 if seed % 4 == 3 else 6 + seed % 8
    t = np.arange(seconds * SAMPLE_RATE) / SAMPLE_RATE
    audio = rng.normal(0, 0.05, t.size) + 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t)
    return audio.astype(np.float32)


@pytest.fixture(scope="module")
def model(tiny_whisper_folder: Path):
    return load_model(str(tiny_whisper_folder))


@pytest.fixture(scope="module")
def plain(model) -> dict:
    """Plain greedy transcripts, by seed (made as the tests ask for them)."""
    return {}


def decoded(bundle, audio: np.ndarray, options: TranscribeOptions, assistant=None) -> tuple[object, list[DecodedWindow]]:
    """The transcript, and every window the model decoded (all its tokens, also those no segment keeps)."""
    windows: list[DecodedWindow] = []
    result = transcribe_many(bundle, [audio], options, assistant, window_observer=windows.append)[0]
    return result, windows


def plain_for(model, plain: dict, seed: int):
    if seed not in plain:
        plain[seed] = decoded(model, synthetic(seed), WITH_WORDS)
    return plain[seed]


def words_of(transcript) -> list[list[tuple[str, float, float]]]:
    return [[(w.word, w.start, w.end) for w in s.words] for s in transcript.segments]


# Assistant -> how many seeds it is checked on (the cheap ones on more).
ASSISTANTS = {"self:int8": 5, "self": 3, "self:bf16": 2, "other random tiny Whisper": 2}


@pytest.mark.parametrize("name", list(ASSISTANTS))
def test_assisted_transcripts_are_the_plain_ones(model, plain: dict, other_tiny_folder: Path, name: str) -> None:
    spec = str(other_tiny_folder) if name.startswith("other") else name
    assistant = make_assistant(spec, model)
    for seed in range(ASSISTANTS[name]):
        expected, expected_windows = plain_for(model, plain, seed)
        options = dataclasses.replace(WITH_WORDS, num_assistant_tokens=1 + seed % 4)
        result, windows = decoded(model, synthetic(seed), options, assistant)
        assert [w.tokens for w in windows] == [w.tokens for w in expected_windows], f"seed {seed}"
        assert [w.prompt for w in windows] == [w.prompt for w in expected_windows]
        assert [s.tokens for s in result.segments] == [s.tokens for s in expected.segments], f"seed {seed}"
        assert [(s.start, s.end) for s in result.segments] == [(s.start, s.end) for s in expected.segments]
        assert result.text == expected.text and result.stats.windows == expected.stats.windows
        # Word times come from one pass of the model over the final tokens: the same with or without an assistant.
        assert words_of(result) == words_of(expected) and any(words_of(expected))
        stats = result.stats.generation
        assert stats.drafted_tokens > 0 and stats.generated_tokens == expected.stats.generation.generated_tokens
        if name == "self":
            assert stats.acceptance_rate == 1.0


@pytest.mark.parametrize("precision", EXACT)
def test_assisted_decoding_gives_the_low_precision_models_own_tokens(tiny_whisper_folder: Path,
                                                                      other_tiny_folder: Path, precision: str) -> None:
    # Assistants that always agree (the model's own int8 copy), sometimes agree (its bfloat16 copy) and almost
    # never agree (another random model), loaded as `asr transcribe --dtype PRECISION --assistant ...` loads them.
    dtype = resolve_precision(precision, "cpu")
    model = load_model(str(tiny_whisper_folder), dtype=dtype)
    audio = load_audio(str(SAMPLES / "park.flac"))
    options = dataclasses.replace(GREEDY, max_new_tokens=60)
    _, expected = decoded(model, audio, options)
    assert len(expected[0].tokens) == 60
    for assistant in ("self:int8", "self:bf16", str(other_tiny_folder)):
        helper = make_assistant(assistant, model, dtype=dtype)
        for k in (1, 4):
            result, windows = decoded(model, audio, dataclasses.replace(options, num_assistant_tokens=k), helper)
            assert [w.tokens for w in windows] == [w.tokens for w in expected], (assistant, k)
            assert result.stats.generation.drafted_tokens > 0


def test_two_windows_and_a_progress_report(model) -> None:
    seen: list[tuple[float, float]] = []
    result = transcribe(model, synthetic(3), GREEDY, progress=lambda done, total: seen.append((done, total)))
    assert result.stats.windows == 2 and result.stats.audio_seconds == 35.0
    # At once (nothing done yet), then after each window.
    assert seen[0] == (0.0, 35.0) and seen[-1] == (35.0, 35.0) and len(seen) == 3 and 0.0 < seen[1][0] < 35.0
    assert all(0.0 <= s.start <= s.end <= 35.0 for s in result.segments)


# --- the scripted model: "hello world" from 0.00 s to 1.00 s in every window, sure of every token ------------------

SCRIPT = [TIMESTAMP_BEGIN, 7751, 1002, TIMESTAMP_BEGIN + 50]  # <|0.00|> hello world <|1.00|>


@pytest.fixture(scope="module")
def scripted(scripted_folder: Path):
    return load_model(str(scripted_folder))


def observed(bundle, audio: np.ndarray, **options) -> tuple[object, list[DecodedWindow]]:
    return decoded(bundle, audio, TranscribeOptions(language="en", **options))


def speech(seconds: float) -> np.ndarray:
    return np.random.default_rng(0).normal(0, 0.1, int(seconds * SAMPLE_RATE)).astype(np.float32)


def test_the_scripted_model_passes_the_checks_at_temperature_zero(scripted) -> None:
    result, windows = observed(scripted, speech(40))
    assert [(s.start, s.end, s.text, s.tokens) for s in result.segments] == [
        (0.0, 1.0, SCRIPTED_TEXT, SCRIPT), (30.0, 31.0, SCRIPTED_TEXT, SCRIPT)]
    assert [w.temperature for w in windows] == [0.0, 0.0]
    assert result.text == SCRIPTED_TEXT * 2
    assert result.stats.generation.generated_tokens == 2 * (len(SCRIPT) + 1)  # and end-of-text, once a window
    assert result.segments[0].avg_logprob > -1e-3 and result.segments[0].no_speech_prob < 0.01


@pytest.mark.parametrize("checks", [{"compression_ratio_threshold": 0.5}, {"logprob_threshold": 0.5}],
                         ids=["too-repetitive", "too-unsure"])
def test_a_window_that_fails_the_checks_is_decoded_again_at_each_higher_temperature(scripted, checks: dict) -> None:
    result, windows = observed(scripted, speech(5), temperatures=(0.0, 0.4, 0.8), no_speech_threshold=None, **checks)
    assert [w.temperature for w in windows] == [0.8]  # the last attempt is the one kept
    assert [(s.text, s.temperature) for s in result.segments] == [(SCRIPTED_TEXT, 0.8)]
    generation = result.stats.generation
    assert generation.generated_tokens == 3 * (len(SCRIPT) + 1)  # every attempt counts
    assert result.stats.windows == 1  # a window counts once, whatever its attempts


def test_a_hot_fallback_stops_the_next_window_seeing_the_previous_text(scripted) -> None:
    from tests.conftest import EOT

    prev = EOT + 104  # <|startofprev|>
    _, cool = observed(scripted, speech(40), temperatures=(0.0, 0.4), compression_ratio_threshold=0.5)
    _, hot = observed(scripted, speech(40), temperatures=(0.0, 0.6), compression_ratio_threshold=0.5)
    assert [w.temperature for w in cool] == [0.4, 0.4] and [w.temperature for w in hot] == [0.6, 0.6]
    assert cool[0].prompt[0] != prev and cool[1].prompt[:1 + len(SCRIPT)] == [prev, *SCRIPT]
    assert hot[1].prompt == hot[0].prompt  # above 0.5 the previous text may be off: not used
    _, unconditioned = observed(scripted, speech(40), condition_on_previous_text=False)
    assert unconditioned[1].prompt == unconditioned[0].prompt


def test_likely_silence_with_unsure_text_is_skipped_without_a_retry(scripted) -> None:
    result, windows = observed(scripted, speech(5), no_speech_threshold=0.0, logprob_threshold=0.5,
                               temperatures=(0.0, 0.4))
    assert [w.temperature for w in windows] == [0.0]  # silence is no reason to retry
    assert result.segments == [] and result.text == "" and result.stats.windows == 1
    # Sure of its text, the window is kept whatever the no-speech probability.
    result, _ = observed(scripted, speech(5), no_speech_threshold=0.0)
    assert result.text == SCRIPTED_TEXT


def test_digital_silence_is_not_decoded(scripted) -> None:
    silence = np.zeros(5 * SAMPLE_RATE, dtype=np.float32)
    result, windows = observed(scripted, silence)
    assert windows == [] and result.text == "" and result.stats.windows == 0
    result, windows = observed(scripted, silence, silence_threshold_db=None)  # decoded: the model says its words
    assert len(windows) == 1 and result.text == SCRIPTED_TEXT


def test_word_timestamps_hold_the_segments_words(scripted) -> None:
    result, _ = observed(scripted, speech(5), word_timestamps=True)
    (segment,) = result.segments
    assert [w.word for w in segment.words] == [" hello", " world"]
    assert all(segment.start <= w.start <= w.end <= segment.end for w in segment.words)


def test_every_window_of_a_long_recording_is_normalised_as_the_whole_file(model, scripted, monkeypatch) -> None:
    """The sequential algorithm gives each window its recording's floor (`audio.recording_floor`, openai-whisper's
    whole-file clamp), computed once per recording; a recording of one window keeps its own."""
    import asr.window_decoder
    from audio import recording_floor

    calls = []
    log_mel = asr.window_decoder.log_mel

    def recording(clips, n_mels, floors=None, **options):
        calls.append(list(floors))
        return log_mel(clips, n_mels, floors=floors, **options)

    monkeypatch.setattr(asr.window_decoder, "log_mel", recording)
    long, short = synthetic(3), synthetic(0)
    long[-10 * SAMPLE_RATE:] *= 0.05  # a quiet end
    transcribe_many(model, [long, short], GREEDY)
    floor = recording_floor(long)
    assert floor is not None
    given = sorted((f for c in calls for f in c), key=lambda f: f is None)
    assert len(given) >= 3 and given == [floor] * (len(given) - 1) + [None]  # the long one's windows, the short one
    # A window that holds part of a short recording only (here a clip of it) gets the recording's floor too.
    calls.clear()
    result = transcribe_many(scripted, [short], dataclasses.replace(GREEDY, clip_timestamps=(0.0, 2.0, 2.5)))
    assert [s.seek for s in result[0].segments] == [0, 250]
    assert [c[0] for c in calls] == [recording_floor(short)] * 2
