"""Live transcription (asr.live, `asr stream`, `asr listen`): drafting from the last hypothesis keeps every
committed word, LocalAgreement-2 commits what two hypotheses share, and the doors a live stream opens (a pipe
of raw PCM, a stream that ends mid-word, minutes of silence, no microphone, Ctrl-C) end in a result or one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from asr.assist.choose import make_assistant
from asr.cli import main
from asr.live import StreamingTranscriber
from asr.live.hypothesis import joined_windows, moved_reference
from asr.live.sources import file_chunks, pcm_chunks
from asr.live.voice import VoiceActivity
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from decoding import ReferenceDraft
from decoding.filters import SamplingOptions

pytestmark = pytest.mark.usefixtures("one_thread")


class _Fallback:
    """A draft source that proposes `[7] * k` and records what it was told."""

    def __init__(self) -> None:
        self.proposed: list[list[int]] = []
        self.updates = 0

    def begin(self, prompts, sampling, generator, stop_tokens=()) -> None:
        pass

    def propose(self, sequences, max_tokens, min_confidence):
        from decoding import Draft

        self.proposed.append(list(max_tokens))
        return [Draft([7] * k) for k in max_tokens]

    def update(self, sequences, num_accepted) -> None:
        self.updates += 1

    def select(self, rows) -> None:
        pass


def test_reference_draft_follows_finds_again_and_falls_back() -> None:
    fallback = _Fallback()
    draft = ReferenceDraft([1, 2, 3, 4, 5, 6], fallback, fallback_k=2, resync_k=2)
    draft.begin([[9, 9]], SamplingOptions(), None)
    assert draft.propose([[9, 9, 1, 2]], [3], None)[0].tokens == [3, 4, 5]  # it follows the reference
    draft.update([[9, 9, 1, 2, 3]], [1])
    assert fallback.updates == 0  # the fallback drafted nothing this round
    assert draft.propose([[9, 9, 1, 8, 4]], [5], None)[0].tokens == [5, 6]  # parted, found again at "4"
    assert draft.propose([[9, 9, 8, 8]], [5], None)[0].tokens == [7, 7]  # nowhere: the fallback, at most 2
    draft.update([[9, 9, 8, 8, 7]], [1])
    assert fallback.updates == 1 and fallback.proposed == [[2]]


def test_reference_draft_proposes_more_after_a_lookup_once_its_proposals_are_kept() -> None:
    draft = ReferenceDraft(list(range(1, 31)), resync_k=2, growth=4)
    draft.begin([[99]], SamplingOptions(), None)
    row = [99, 1, 2, 50, 4]  # parted at 3, then found again at 4
    assert draft.propose([row], [23], None)[0].tokens == [5, 6]
    row += [5, 6, 7]  # both kept, and the model's own 7
    draft.update([row], [2])
    assert draft.propose([row], [23], None)[0].tokens == list(range(8, 16))  # four times as many
    row += [8, 9, 60]  # two kept, then parted
    draft.update([row], [2])
    assert draft.propose([row], [23], None)[0].tokens == []  # 60 is nowhere in the reference
    row += [13]
    draft.update([row], [0])
    assert draft.propose([row], [23], None)[0].tokens == [14, 15]  # found again: short, as the last was not whole
    assert draft.propose([[99, 1, 50, 29]], [23], None)[0].tokens == []  # a lookup that lands on the last token
    assert draft.propose([[99, *range(1, 30)]], [23], None)[0].tokens == [30]  # which a prefix proposes


def test_moved_reference_starts_after_the_segment_that_ends_at_the_cut() -> None:
    begin = 50364
    tokens = [begin, 11, 12, begin + 100, begin + 100, 13, begin + 150]  # <0.00> a b <2.00><2.00> c <3.00>
    assert moved_reference(tokens, 2.0, begin) == [begin, 13, begin + 50]
    assert moved_reference(tokens, 1.0, begin) == []


def test_joined_windows_read_as_one_window_of_the_whole_buffer() -> None:
    begin = 50364
    first = [begin, 11, begin + 100, begin + 100]  # <0.00> a <2.00><2.00>: the second window starts at 2 s
    second = [begin, 12, 13, begin + 50]  # <0.00> b c <1.00>
    assert joined_windows([first, second], [0.0, 2.0], begin) == [begin, 11, begin + 100, begin + 100, 12, 13,
                                                                  begin + 150]
    assert joined_windows([first], [0.0], begin) == first


@pytest.fixture(scope="module")
def tiny(tiny_whisper_folder: Path):
    return load_model(str(tiny_whisper_folder))


def _stream(bundle, audio: np.ndarray, assistant, max_new_tokens: int = 24, trim_seconds: float = 6.0,
            drafting: bool = True):
    live = StreamingTranscriber(bundle, TranscribeOptions(language="en", max_new_tokens=max_new_tokens), assistant,
                                drafting=drafting, trim_seconds=trim_seconds)
    committed = []
    for chunk in file_chunks(audio, 1.0, realtime=False):
        live.insert_audio(chunk)
        committed += live.process()
    committed += live.finish()
    return live, committed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafting_from_the_last_hypothesis_commits_the_same_words_with_fewer_passes(tiny, seed: int) -> None:
    audio = np.random.default_rng(seed).normal(0, 0.1, 12 * 16000).astype(np.float32)
    plain, expected = _stream(tiny, audio, None, drafting=False)
    drafted, got = _stream(tiny, audio, make_assistant("self:int8", tiny))
    alone, by_hypothesis = _stream(tiny, audio, None)  # the last hypothesis alone (auto may choose no assistant)
    assert [(s.text, s.start, s.end, s.emitted_at) for s in got] == \
           [(s.text, s.start, s.end, s.emitted_at) for s in expected]
    assert [s.text for s in by_hypothesis] == [s.text for s in expected]
    assert plain.stats.updates == drafted.stats.updates == alone.stats.updates == 12
    assert drafted.stats.generation.accepted_tokens > 0 and alone.stats.generation.accepted_tokens > 0
    for run in (drafted, alone):
        assert run.stats.generation.model_forward_passes < plain.stats.generation.model_forward_passes
    assert (plain.stats.assistant, alone.stats.assistant) == ("none", "hypothesis")


def test_a_stream_leaves_out_a_draft_chosen_for_files_only(tiny, caplog) -> None:
    audio = np.random.default_rng(3).normal(0, 0.1, 5 * 16000).astype(np.float32)
    chosen = make_assistant("self:int8", tiny)
    chosen.for_streams = False  # as `auto` marks the shipped draft it picks on a CPU (tests/test_auto.py)
    with caplog.at_level("INFO", logger="asr.live.transcriber"):
        by_auto, committed_by_auto = _stream(tiny, audio, chosen)
    named, committed_by_name = _stream(tiny, audio, make_assistant("self:int8", tiny))
    assert by_auto.assistant is None and by_auto.stats.assistant == "hypothesis"
    assert "drafting from the last hypothesis alone" in caplog.text
    assert named.assistant is not None and named.stats.assistant.startswith("hypothesis+self")
    assert named.stats.generation.assistant_forward_passes > 0
    assert by_auto.stats.generation.assistant_forward_passes == 0
    assert [s.text for s in committed_by_auto] == [s.text for s in committed_by_name]


def test_committed_words_are_where_two_hypotheses_agree_and_the_rest_comes_at_the_end(tiny) -> None:
    audio = np.random.default_rng(5).normal(0, 0.1, 7 * 16000).astype(np.float32)
    # A random model's text loops: every window is kept here (the repetition check has a test of its own).
    options = TranscribeOptions(language="en", max_new_tokens=24, compression_ratio_threshold=None)
    live = StreamingTranscriber(tiny, options, None, drafting=False)
    committed = []
    for chunk in file_chunks(audio, 1.0, realtime=False):
        live.insert_audio(chunk)
        before = list(live._hypothesis)
        for segment in live.process():
            # What an update commits is where its hypothesis and the one before agree, word for word.
            assert [w.word.strip() for w in segment.words] == [w.word.strip() for w in before[:len(segment.words)]]
            committed.append(segment)
    pending = [w.word for w in live._hypothesis if w.word.strip()]
    last = live.finish()  # the stream ended mid-hypothesis: the rest is committed now
    assert [w.word for s in last for w in s.words] == pending and live._hypothesis == []
    words = [w for s in committed + last for w in s.words]
    assert words and all(a.start <= b.start for a, b in zip(words, words[1:]))
    stats = live.stats.to_dict()
    assert stats["committed_words"] == len(words) and stats["latency_p90"] >= stats["latency_p50"] >= 0


def test_hypotheses_agree_on_words_whatever_punctuation_and_case_surround_them(tiny, monkeypatch) -> None:
    from asr.results import Word

    def words(*texts: str) -> list[Word]:
        return [Word(f" {t}", i * 0.5, i * 0.5 + 0.4, 1.0) for i, t in enumerate(texts)]

    # What three updates hear: the first ends a sentence where the second, with more audio, goes on.
    heard = iter([words("From", "fairest", "creatures."), words("from", "fairest", "creatures,", "we"),
                  words("From", "fairest", "creatures,", "we", "desire")])
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en"), None, drafting=False)
    monkeypatch.setattr(live, "_decode", lambda *args, **kwargs: (next(heard), []))
    live.insert_audio(np.zeros(16000, dtype=np.float32))
    assert live.process() == []
    second = live.process()  # agreed whatever the case and the comma: the newer hypothesis's form is committed
    assert [w.word for s in second for w in s.words] == [" from", " fairest", " creatures,"]
    assert [w.word for s in live.process() for w in s.words] == [" we"]
    assert live.pending_text == "desire"


def test_new_words_begin_after_the_committed_words_heard_again_not_at_a_time(tiny, monkeypatch) -> None:
    from asr.results import Word

    def words(*spans: tuple[str, float, float]) -> list[Word]:
        return [Word(f" {t}", start, end, 1.0) for t, start, end in spans]

    # VoxPopuli, base, 2026-12-08: "significantly" committed with a span drawn over the next word, which the
    # later updates hear: by time alone "reduced" (63.14 s) started before the committed end and was lost.
    heard = iter([words(("has", 61.5, 62.1), ("been", 62.2, 62.3), ("significantly", 62.3, 63.3)),
                  words(("has", 61.5, 62.1), ("been", 62.2, 62.3), ("significantly", 62.3, 63.3)),
                  words(("been", 62.2, 62.3), ("significantly", 62.3, 63.1), ("reduced", 63.1, 64.1),
                        ("but", 64.1, 65.6)),
                  words(("significantly", 62.3, 63.1), ("reduced", 63.1, 64.1), ("but", 64.1, 65.6))])
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en"), None, drafting=False)
    monkeypatch.setattr(live, "_decode", lambda *args, **kwargs: (next(heard), []))
    live.insert_audio(np.zeros(16000, dtype=np.float32))
    committed = live.process() + live.process() + live.process() + live.process()
    assert [w.word.strip() for s in committed for w in s.words] == ["has", "been", "significantly", "reduced",
                                                                    "but"]

    # The sonnets: the buffer cut at 76.36 s inside the committed "say" (to 76.44 s); its tail, heard again at
    # the new buffer's head, is no new word, and the words after it are.
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en"), None, drafting=False)
    live._commit(words(("to", 76.0, 76.1), ("say", 76.1, 76.44)))
    after = live._after_committed(words(("day", 76.36, 76.48), ("within", 76.48, 76.86), ("thy", 76.86, 77.2)))
    assert [w.word.strip() for w in after] == ["within", "thy"]


def test_a_window_that_fails_the_repetition_check_commits_nothing(tiny) -> None:
    audio = np.random.default_rng(5).normal(0, 0.1, 7 * 16000).astype(np.float32)
    committed = {}
    for limit in (None, 0.01):  # 0.01: every window's text "loops"
        options = TranscribeOptions(language="en", max_new_tokens=24, compression_ratio_threshold=limit)
        live = StreamingTranscriber(tiny, options, None, drafting=False)
        segments = []
        for chunk in file_chunks(audio, 1.0, realtime=False):
            live.insert_audio(chunk)
            segments += live.process()
        segments += live.finish()
        committed[limit] = (segments, live.stats.to_dict()["repetitive_windows"])
    assert committed[None][0] and committed[None][1] == 0
    assert committed[0.01][0] == [] and committed[0.01][1] >= 7


def test_minutes_of_silence_commit_nothing_and_keep_the_buffer_within_a_window(tiny) -> None:
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en", max_new_tokens=8), None, drafting=False)
    for _ in range(90):  # three minutes, two seconds at a time
        live.insert_audio(np.zeros(2 * 16000, dtype=np.float32))
        assert live.process() == []
        assert len(live._buffer) <= 30 * 16000
    assert live.finish() == [] and live.stats.audio_seconds == 180


def _speech() -> np.ndarray:
    from audio import load_audio
    from tests.conftest import EVALDATA

    return load_audio(EVALDATA / "clips" / "jfk.flac")[:40000]  # 0.4-2.3 s: "And so, my fellow Americans"


def test_the_voice_detector_hears_speech_start_and_end_as_audio_arrives() -> None:
    speech = _speech()
    voice = VoiceActivity()
    voice.add(np.zeros(16000, dtype=np.float32))
    assert not voice.speaking and voice.speech_start is None
    for chunk in file_chunks(np.concatenate([speech, np.zeros(2 * 16000, dtype=np.float32)]), 0.3, False):
        voice.add(chunk)  # chunks that are not whole frames: the rest waits for the next
    assert not voice.speaking and voice.scored == (len(speech) + 3 * 16000) // 512 * 512
    assert 16000 + 3200 <= voice.speech_start <= 16000 + 9600
    assert 16000 + 32000 <= voice.speech_end <= 16000 + 40000


def test_with_vad_minutes_of_silence_decode_nothing_and_keep_only_a_pad(tiny) -> None:
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en", max_new_tokens=8), None,
                                voice=VoiceActivity())
    noise = np.random.default_rng(0)
    for _ in range(90):  # three minutes of quiet room noise, two seconds at a time
        live.insert_audio(noise.normal(0, 0.002, 2 * 16000).astype(np.float32))
        assert live.process() == []
        assert len(live._buffer) <= 0.31 * 16000
    assert live.finish() == [] and live.stats.updates == 0 and live.stats.audio_seconds == 180


def test_with_vad_a_pause_commits_the_utterance_before_it_whole(tiny) -> None:
    speech, pause = _speech(), np.zeros(3 * 16000, dtype=np.float32)
    live = StreamingTranscriber(tiny, TranscribeOptions(language="en", max_new_tokens=12), None,
                                voice=VoiceActivity())
    committed = []
    for chunk in file_chunks(np.concatenate([pause, speech, pause]), 1.0, realtime=False):
        live.insert_audio(chunk)
        committed += live.process()
    # The pause ended the speech: everything of it was committed before the stream ended, none left pending.
    assert committed and live._hypothesis == [] and len(live._buffer) <= 0.31 * 16000
    assert live.finish() == []
    updates = live.stats.updates
    assert 1 <= updates <= 6  # the speech's seconds and the pause's commit, not the silence around it
    assert all(2.5 <= w.start for s in committed for w in s.words)


def test_raw_pcm_chunks_pair_odd_bytes_and_resample() -> None:
    import io

    samples = (np.sin(np.arange(48000) / 10) * 20000).astype("<i2")
    data = samples.tobytes() + b"\x01"  # an odd byte at the end is dropped
    got = np.concatenate(list(pcm_chunks(io.BytesIO(data), 0.25)))
    assert np.allclose(got, samples / 32768.0)
    resampled = np.concatenate(list(pcm_chunks(io.BytesIO(samples.tobytes()), 0.25, rate=48000)))
    assert abs(len(resampled) - 16000) <= 1


def _raw(tmp_path: Path, seconds: float) -> Path:
    path = tmp_path / "noise.raw"
    noise = np.random.default_rng(3).normal(0, 3000, int(seconds * 16000)).astype("<i2")
    path.write_bytes(noise.tobytes() + b"\x05")
    return path


def test_stream_command_prints_json_lines_then_stats_and_writes_the_transcript(tiny_whisper_folder: Path,
                                                                              tmp_path: Path) -> None:
    raw = _raw(tmp_path, 5)
    result = CliRunner().invoke(main, ["stream", "-", "--model", str(tiny_whisper_folder), "--language", "en",
                                       "-f", "jsonl", "-o", str(tmp_path / "out"), "-q", "--assistant", "self:int8"],
                                input=raw.read_bytes())
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    assert set(lines[-1]) == {"stats"} and lines[-1]["stats"]["updates"] >= 5
    assert lines[-1]["stats"]["assistant"] == "hypothesis+self:int8"
    assert all({"start", "end", "text", "emitted_at"} == set(line) for line in lines[:-1])
    written = json.loads((tmp_path / "out" / "stdin.json").read_text())
    assert written["text"] == "".join(line["text"] for line in lines[:-1])


def test_stream_command_with_vad_decodes_no_silence(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    raw = tmp_path / "quiet.raw"
    raw.write_bytes(np.random.default_rng(1).normal(0, 60, 20 * 16000).astype("<i2").tobytes())
    result = CliRunner().invoke(main, ["stream", "-", "--model", str(tiny_whisper_folder), "--language", "en",
                                       "-f", "jsonl", "-q", "--vad"], input=raw.read_bytes())
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    assert lines == [lines[-1]] and lines[-1]["stats"]["updates"] == 0
    assert lines[-1]["stats"]["audio_seconds"] == 20 and lines[-1]["stats"]["assistant"] == "hypothesis"


@pytest.mark.parametrize("args, message", [
    (["--step", "0"], "--step must be from 0.1 to 10 seconds, got 0"),
    (["-f", "srt"], "-f srt writes the transcript when the stream ends: give -o DIR"),
    (["--input-rate", "5"], "--input-rate must be from 1000 to 768000 Hz, got 5"),
    (["--compression-ratio-threshold", "0"], "compression ratio threshold must be > 0, got 0.0"),
])
def test_bad_stream_options_are_one_line(tiny_whisper_folder: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["stream", "-", "--model", str(tiny_whisper_folder), *args], input=b"")
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == f"Error: {message}"


def test_no_portaudio_is_one_line_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def without_portaudio(name, *args, **kwargs):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_portaudio)
    result = CliRunner().invoke(main, ["listen", "-q", "--model", "nowhere"])
    assert result.exit_code == 1
    assert "needs the sounddevice package and the PortAudio library" in result.output


def test_ctrl_c_commits_and_writes_what_was_heard(tiny_whisper_folder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import asr.live.sources

    def interrupted(samples, step, realtime, clock=None):
        yield from list(file_chunks(samples, step, False))[:4]
        raise KeyboardInterrupt

    monkeypatch.setattr(asr.live.sources, "file_chunks", interrupted)
    import soundfile

    audio = tmp_path / "noise.wav"
    soundfile.write(audio, np.random.default_rng(4).normal(0, 0.1, 8 * 16000).astype(np.float32), 16000)
    result = CliRunner().invoke(main, ["stream", str(audio), "--model", str(tiny_whisper_folder), "--language", "en",
                                       "-o", str(tmp_path / "out"), "-f", "txt", "--assistant", "none",
                                       "--compression-ratio-threshold", "none"])  # a random model's text loops
    assert result.exit_code == 0, result.output
    assert "stopped: committing what was heard" in result.output
    written = (tmp_path / "out" / "noise.txt").read_text()
    assert written.strip() and written.split() == " ".join(
        line for line in result.output.splitlines() if not line.startswith(("loading", "assistant", "stopped",
                                                                              "wrote"))).split()


@pytest.mark.slow  # base on real speech
def test_real_speech_streams_the_same_words_with_and_without_drafting() -> None:
    from audio import load_audio
    from tests.conftest import EVALDATA

    bundle = load_model("base")
    audio = load_audio(EVALDATA / "clips" / "jfk.flac")
    plain, expected = _stream(bundle, audio, None, max_new_tokens=224, trim_seconds=15.0, drafting=False)
    drafted, got = _stream(bundle, audio, make_assistant("auto", bundle), max_new_tokens=224, trim_seconds=15.0)
    assert "".join(s.text for s in got) == "".join(s.text for s in expected)
    assert "ask not what your country can do for you" in "".join(s.text for s in got).lower()
    assert drafted.stats.generation.model_forward_passes * 2 < plain.stats.generation.model_forward_passes
