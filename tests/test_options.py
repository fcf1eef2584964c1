"""The further decoding options (issue 14) on a tiny random Whisper and synthetic audio: each option's effect,
the live segment generator, language detection, and the CLI's one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from asr.cli import main
from asr.options import TranscribeOptions, parse_clip_timestamps, parse_suppress_tokens
from asr.transcription import transcribe, transcribe_many, transcribe_segments
from audio import SAMPLE_RATE
from tests.conftest import tiny_whisper_in

pytestmark = pytest.mark.usefixtures("one_thread")

# Few tokens a window: a random model never stops on its own.
FAST = dict(temperatures=(0.0,), max_new_tokens=12)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_whisper_in(tmp_path_factory.mktemp("tiny-options"), seed=3)


@pytest.fixture(scope="module")
def tiny(tiny_folder: Path):
    from asr.models.registry import load_model

    return load_model(str(tiny_folder))


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.1 * rng.standard_normal(t.size) + 0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def windows_of(bundle, audio, options, assistant=None):
    seen = []
    transcript = transcribe_many(bundle, [audio], options, assistant, batch_size=1, window_observer=seen.append)[0]
    return transcript, seen


def test_timestamp_tokens_are_on_unless_batched_or_asked_otherwise() -> None:
    assert TranscribeOptions().uses_timestamps is True
    assert TranscribeOptions(batch_size=8).uses_timestamps is False
    assert TranscribeOptions(batch_size=8, timestamps=True).uses_timestamps is True
    assert TranscribeOptions(timestamps=False).uses_timestamps is False
    assert TranscribeOptions(vad=None, batch_size=None).uses_timestamps is True
    assert TranscribeOptions().timestamps is None  # as given: the options are frozen, never rewritten


def test_suppressed_ids_never_appear(tiny) -> None:
    audio = noise(10)
    plain, _ = windows_of(tiny, audio, TranscribeOptions(**FAST))
    text_ids = [t for s in plain.segments for t in s.tokens if t < tiny.special.eot]
    assert text_ids
    common = max(set(text_ids), key=text_ids.count)
    suppressed, seen = windows_of(tiny, audio, TranscribeOptions(**FAST, suppress_tokens=(-1, common)))
    assert all(common not in w.tokens for w in seen)
    assert all(common not in s.tokens for s in suppressed.segments)


def test_clip_timestamps_limit_segments_to_the_clips(tiny) -> None:
    result = transcribe(tiny, noise(25), TranscribeOptions(**FAST, clip_timestamps=(2.0, 8.0, 15.0, 20.0)))
    assert result.segments
    for segment in result.segments:
        assert 2 <= segment.start <= segment.end <= 8 or 15 <= segment.start <= segment.end <= 20, segment


def test_prefix_starts_the_first_window(tiny) -> None:
    prefix = tiny.tokenizer.encode(" hello world", add_special_tokens=False)
    result, seen = windows_of(tiny, noise(10), TranscribeOptions(**FAST, prefix="hello world"))
    assert seen[0].prompt[-len(prefix) - 1:] == [tiny.special.timestamp_begin, *prefix]
    assert result.segments[0].tokens[:len(prefix) + 1] == [tiny.special.timestamp_begin, *prefix]
    assert result.text.startswith(" hello world")


def test_carry_initial_prompt_is_in_every_window(tiny) -> None:
    initial = tiny.tokenizer.encode(" Names: Ada, Grace.", add_special_tokens=False)
    options = TranscribeOptions(**FAST, initial_prompt="Names: Ada, Grace.", carry_initial_prompt=True)
    _, seen = windows_of(tiny, noise(40), options)
    assert len(seen) >= 2
    for window in seen:
        assert window.prompt[:len(initial) + 1] == [tiny.special.prev, *initial]
    # Without the previous text, only a carried initial prompt is in the later windows.
    carried = dict(FAST, initial_prompt="Names: Ada, Grace.", condition_on_previous_text=False)
    _, seen = windows_of(tiny, noise(40), TranscribeOptions(**carried, carry_initial_prompt=True))
    assert seen[1].prompt[:seen[1].prompt.index(tiny.special.sot)] == [tiny.special.prev, *initial]
    _, plain = windows_of(tiny, noise(40), TranscribeOptions(**carried))
    assert plain[1].prompt[0] == tiny.special.sot


def test_hotwords_are_in_every_prompt_without_prefix(tiny) -> None:
    hot = tiny.tokenizer.encode(" Kubernetes", add_special_tokens=False)
    _, seen = windows_of(tiny, noise(40), TranscribeOptions(**FAST, hotwords="Kubernetes"))
    assert len(seen) >= 2 and all(w.prompt[:len(hot) + 1] == [tiny.special.prev, *hot] for w in seen)
    _, seen = windows_of(tiny, noise(40), TranscribeOptions(**FAST, hotwords="Kubernetes", prefix="so"))
    assert seen[0].prompt[0] != tiny.special.prev  # the prefix's window has no hotwords
    assert seen[1].prompt[:len(hot) + 1] == [tiny.special.prev, *hot]


@pytest.mark.parametrize("spec", ["self:int8", "self:bf16"])
def test_assisted_words_are_the_models_with_prompt_options(tiny, spec: str) -> None:
    from asr.assist.choose import make_assistant

    assistant = make_assistant(spec, tiny)
    audio = noise(40, seed=1)
    for options in (TranscribeOptions(**FAST, prefix="hello world", hotwords="Kubernetes"),
                    TranscribeOptions(**FAST, initial_prompt="Ada, Grace.", carry_initial_prompt=True),
                    TranscribeOptions(**FAST, multilingual=True, suppress_tokens=(-1, 220), clip_timestamps=(1.0, 25.0))):
        plain = transcribe(tiny, audio, options)
        assisted = transcribe(tiny, audio, options, assistant)
        assert [s.tokens for s in assisted.segments] == [s.tokens for s in plain.segments]


def test_generator_yields_the_segments_of_transcribe(tiny) -> None:
    audio, options = noise(40), TranscribeOptions(**FAST)
    whole = transcribe(tiny, audio, options)
    live = transcribe_segments(tiny, audio, options)
    segments = list(live)
    assert [s.to_dict() for s in segments] == [s.to_dict() for s in whole.segments]
    assert live.result().text == whole.text
    assert live.result().language == whole.language
    assert live.language == whole.language and live.language_probs == whole.language_probs


def test_language_probs_and_multi_window_detection(tiny) -> None:
    from asr.whisper.language import detect_language
    from asr.writers import write_json

    audio = noise(40)
    result = transcribe(tiny, audio, TranscribeOptions(**FAST))
    import io

    out = io.StringIO()
    write_json(result, out)
    probs = json.loads(out.getvalue())["language_probs"]
    assert max(probs, key=probs.get) == result.language and abs(sum(probs.values()) - 1) < 1e-3
    first = detect_language(tiny, audio[:30 * SAMPLE_RATE])[1]
    second = detect_language(tiny, audio[30 * SAMPLE_RATE:])[1]
    language, averaged = detect_language(tiny, audio, segments=2, threshold=1.0)
    assert averaged[language] == pytest.approx((first[language] + second[language]) / 2, abs=1e-5)
    assert detect_language(tiny, audio, segments=2, threshold=0.0)[1] == pytest.approx(first)


def test_multilingual_sets_each_segments_language(tiny) -> None:
    result = transcribe(tiny, noise(40), TranscribeOptions(**FAST, multilingual=True))
    assert result.segments and all(s.language in tiny.special.languages for s in result.segments)
    assert all("language" in s.to_dict() for s in result.segments)
    assert "language" not in transcribe(tiny, noise(10), TranscribeOptions(**FAST)).segments[0].to_dict()


@pytest.mark.parametrize("timestamps", [True, False])
def test_hallucination_threshold_runs_with_word_timestamps(tiny, timestamps: bool) -> None:
    result = transcribe(tiny, noise(40), TranscribeOptions(**FAST, word_timestamps=True, timestamps=timestamps,
                                                           hallucination_silence_threshold=1.0))
    assert all(s.words is not None for s in result.segments)


@pytest.mark.parametrize("kwargs, message", [
    (dict(compression_ratio_threshold=-1.0), "compression ratio"),
    (dict(no_speech_threshold=1.5), "no-speech"),
    (dict(logprob_threshold=float("nan")), "nan"),
    (dict(clip_timestamps=(5.0, 2.0)), "end after"),
    (dict(clip_timestamps=(float("inf"),)), "seconds >= 0, got inf"),
    (dict(clip_timestamps=(0.0, float("inf"))), "seconds >= 0, got 0,inf"),
    (dict(clip_timestamps=(float("nan"),)), "seconds >= 0, got nan"),
    (dict(clip_timestamps="1,2"), "parse_clip_timestamps"),
    (dict(suppress_tokens=(-2,)), "suppress"),
    (dict(suppress_tokens="1,2"), "parse_suppress_tokens"),
    (dict(suppress_tokens=(1, "a")), "suppress"),
    (dict(language_detection_segments=0), "detection segments"),
    (dict(language_detection_threshold=2.0), "detection threshold"),
    (dict(hallucination_silence_threshold=1.0), "word timestamps"),
    (dict(carry_initial_prompt=True), "initial prompt"),
    (dict(multilingual=True, language="en"), "multilingual"),
])
def test_bad_values_are_errors(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TranscribeOptions(**kwargs)


def test_text_forms_are_parsed_by_their_parsers() -> None:
    assert parse_suppress_tokens("-1,50257") == (-1, 50257) and parse_suppress_tokens("") == ()
    assert parse_clip_timestamps("0,5.5,10") == (0.0, 5.5, 10.0)
    with pytest.raises(ValueError, match="suppress tokens"):
        parse_suppress_tokens("1,a")
    with pytest.raises(ValueError, match="clip timestamps"):
        parse_clip_timestamps("1,x")


def test_unknown_suppress_token_is_an_error(tiny) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        transcribe(tiny, noise(1), TranscribeOptions(suppress_tokens=(10**6,)))


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "clip.wav"
    sf.write(path, noise(8), SAMPLE_RATE)
    return path


@pytest.mark.parametrize("args, message", [
    (["--compression-ratio-threshold", "-2"], "compression ratio"),
    (["--logprob-threshold", "abc"], "number"),
    (["--clip-timestamps", "1,b"], "clip timestamps"),
    (["--clip-timestamps", "4,1"], "end after"),
    (["--suppress-tokens", "99999999"], "vocabulary"),
    (["--language-detection-segments", "0"], "detection segments"),
    (["--hallucination-silence-threshold", "2"], "word timestamps"),
])
def test_cli_bad_values_are_one_line_errors(tiny_folder: Path, wav: Path, args, message: str) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(wav), "--model", str(tiny_folder), "-q", *args])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert message in result.output and lines[-1].startswith(("Error", "error")), result.output


def test_cli_verbose_prints_each_segment(tiny_folder: Path, wav: Path) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(wav), "--model", str(tiny_folder), "--verbose",
                                       "--temperature", "0", "--suppress-tokens", "-1"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("[")]
    assert lines and all(re.match(r"\[\d\d:\d\d\.\d{3} --> \d\d:\d\d\.\d{3}\] ", line) for line in lines)
    # Not the text again after the segments.
    assert all(line.startswith(("[", "Detected language: ")) for line in result.stdout.splitlines())
    assert result.stdout.startswith("Detected language: ")


def test_cli_detect_language_prints_a_language(tiny, tiny_folder: Path, wav: Path) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(wav), "--model", str(tiny_folder), "--detect-language",
                                       "--language-detection-segments", "2"])
    assert result.exit_code == 0, result.output
    path, rest = result.stdout.strip().rsplit(": ", 1)
    code, probability = rest.split()
    assert path == str(wav) and code in tiny.special.languages and 0 < float(probability) <= 1
    piped = CliRunner().invoke(main, ["transcribe", "-", "--model", str(tiny_folder), "--detect-language",
                                      "--language-detection-segments", "2"], input=wav.read_bytes())
    assert piped.exit_code == 0 and piped.stdout.strip() == result.stdout.strip().replace(str(wav), "<stdin>")


def test_cli_detect_language_reads_a_long_recording_as_transcribing_it_does(tiny_folder: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A quiet first window of a longer recording: both clamp its features at the recording's floor
    # (audio.recording_floor), as transcription's detection over the first window's encoder output does.
    import asr.whisper.language
    from audio import load_audio, recording_floor

    audio = noise(45) * 2
    audio[:30 * SAMPLE_RATE] *= 0.0015  # -56 dBFS at its peak, not skipped as silence; 16 % of it below the floor
    path = tmp_path / "quiet-start.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    seen = []
    log_mel = asr.whisper.language.log_mel

    def spy(clips, n_mels, floors=None, **options):
        seen.extend(floors or [None])
        return log_mel(clips, n_mels, floors=floors, **options)

    monkeypatch.setattr(asr.whisper.language, "log_mel", spy)
    result = CliRunner().invoke(main, ["transcribe", str(path), "--model", str(tiny_folder), "--detect-language",
                                       "--language-detection-segments", "2", "--language-detection-threshold", "1"])
    assert result.exit_code == 0, result.output
    expected = recording_floor(load_audio(str(path)))
    assert expected is not None and seen == [expected, expected]


def test_cli_detect_language_per_channel_with_split_stereo(tiny_folder: Path, tmp_path: Path) -> None:
    t = np.arange(SAMPLE_RATE * 2) / SAMPLE_RATE
    stereo = np.stack([0.3 * np.sin(2 * np.pi * 220 * t), 0.3 * np.sin(2 * np.pi * 550 * t)], axis=1)
    sf.write(tmp_path / "call.wav", stereo.astype(np.float32), SAMPLE_RATE)
    result = CliRunner().invoke(main, ["transcribe", str(tmp_path / "call.wav"), "--model", str(tiny_folder),
                                       "--detect-language", "--split-stereo"])
    assert result.exit_code == 0, result.output
    names = [line.rsplit(": ", 1)[0] for line in result.stdout.strip().splitlines()]
    assert names == [f"{tmp_path / 'call.wav'} (left)", f"{tmp_path / 'call.wav'} (right)"]


def test_batched_windows_with_and_without_prefix_match_alone(tiny) -> None:
    # With two places, the third audio's first window (prefix) is decoded beside the second's later windows.
    audios, options = [noise(8, 1), noise(40, 2), noise(8, 3)], TranscribeOptions(**FAST, prefix="hello")
    together = transcribe_many(tiny, audios, options, batch_size=2)
    for audio, result in zip(audios, together):
        alone = transcribe(tiny, audio, options)
        assert [s.tokens for s in result.segments] == [s.tokens for s in alone.segments]
        assert result.text.startswith(" hello")


def test_full_assistant_prompt_keeps_the_forced_start(tiny) -> None:
    from asr.assist.assistants import FullAssistant
    from asr.whisper.window import WindowContext

    prefix = tiny.tokenizer.encode(" hello", add_special_tokens=False)
    model_prompt, _ = tiny.special.prompt([], "en", "transcribe", True, prefix)
    forced = [tiny.special.timestamp_begin, *prefix]
    window = WindowContext(None, None, model_prompt, [], [], "en", "transcribe", True, forced)
    assert FullAssistant("same", tiny, tiny)._prompt(window) == (model_prompt, len(forced))


def test_batch_command_takes_the_decoding_options(tiny, tiny_folder: Path, wav: Path, tmp_path: Path) -> None:
    output = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(main, ["batch", str(wav.parent), "-o", str(output), "--model", str(tiny_folder), "-q",
                                       "--multilingual", "--suppress-tokens", "-1,220", "--no-speech-threshold", "none",
                                       "--segments", "--workers", "0"])
    assert result.exit_code == 0, result.output
    row = json.loads(output.read_text().splitlines()[0])
    assert row["segments"] and all(s["language"] in tiny.special.languages for s in row["segments"])
    assert all(220 not in s["tokens"] for s in row["segments"])
    bad = CliRunner().invoke(main, ["batch", str(wav.parent), "-o", str(tmp_path / "bad.jsonl"), "--model",
                                    str(tiny_folder), "--language-detection-threshold", "3"])
    assert bad.exit_code != 0 and "detection threshold" in bad.output


def test_english_only_models_refuse_language_detection(tiny) -> None:
    from types import SimpleNamespace

    from asr.cli.options import note_moot_options
    from asr.options import check_for_model
    from asr.whisper.language import detect_language

    english = SimpleNamespace(name="tiny.en", is_multilingual=False, tokenizer=tiny.tokenizer, special=tiny.special)
    with pytest.raises(ValueError, match="English-only"):
        check_for_model(TranscribeOptions(multilingual=True), english)
    with pytest.raises(ValueError, match="English-only"):
        detect_language(english, noise(1))
    with pytest.raises(ValueError, match="English-only"):
        note_moot_options(TranscribeOptions(), english, detect_only=True)
    note_moot_options(TranscribeOptions(language_detection_segments=3), english, detect_only=False)  # a note only


def test_progress_bar_for_any_file_over_one_window_unless_verbose(tiny, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    import tqdm

    from asr.cli.transcribe import transcribe_file
    from asr.transcription import Transcriber

    made = []

    class Bar:
        n = 0.0

        def __init__(self, **kwargs) -> None:
            made.append(kwargs)

        def update(self, n: float) -> None:
            self.n += n

        def close(self) -> None:
            pass

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    transcriber = Transcriber(tiny, TranscribeOptions(**FAST))
    transcribe_file(transcriber, noise(10))
    assert not made
    transcribe_file(transcriber, noise(35))
    assert len(made) == 1
    transcribe_file(transcriber, noise(35), verbose=True)
    transcribe_file(transcriber, noise(35), show_progress=False)
    assert len(made) == 1
    assert capsys.readouterr().out.count(" --> ") >= 1


def test_a_hallucination_between_silences_is_dropped_and_skipped() -> None:
    from types import SimpleNamespace

    from asr.hallucination import is_segment_anomaly, skip_hallucinations
    from asr.results import Segment, Word
    from asr.whisper.window import WindowResult

    def segment(start: float, end: float, probability: float) -> Segment:
        words = [Word(" word", start + i * (end - start) / 3, start + (i + 1) * (end - start) / 3, probability)
                 for i in range(3)]
        return Segment(0, 0, start, end, " word word word", [1, 2, 3], 0.0, -0.5, 1.0, 0.1, words)

    speech, hallucination = segment(0.5, 3.0, 0.9), segment(15.0, 15.1, 0.05)
    assert not is_segment_anomaly(speech) and is_segment_anomaly(hallucination)
    item = SimpleNamespace(options=TranscribeOptions(word_timestamps=True, hallucination_silence_threshold=2.0),
                           seek=0, segment_size=3000, content_frames=6000, last_speech_timestamp=0.0)
    ts = 50365
    result = WindowResult([ts, 1, 2, 3, ts + 150, ts + 750, 1, 2, 3, ts + 755], 0.0, -0.5, 1.0, 0.1)
    kept, advance = skip_hallucinations(item, result, [speech, hallucination], 3000, ts)
    assert kept == [speech] and advance == 1500  # decoding resumes at the hallucination's start
    assert item.last_speech_timestamp == pytest.approx(3.0)

