"""`asr transcribe -` (standard input), `--split-stereo`, the subtitle layout options, and `load_audio(channel=)`,
with a tiny random Whisper (no downloaded weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from asr.cli import main
from asr.results import Segment, Transcript, TranscriptionStats, Word
from asr.writers import SubtitleOptions, write_srt
from audio import AudioError, ChannelError, load_audio, load_audio_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

# Greedy only (no temperature fallbacks: a random model fails every check), on the CPU, English given.
FAST = ["--device", "cpu", "-q", "--language", "en", "--temperature", "0", "--word-timestamps"]


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """talk.wav: a tone on the left, noise on the right (float WAV, so each channel is kept exactly); left.wav,
    right.wav: each channel alone; mono.wav."""
    folder = tmp_path_factory.mktemp("calls")
    t = np.arange(16000 * 2) / 16000
    left = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    right = (0.2 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    sf.write(folder / "talk.wav", np.stack([left, right], axis=1), 16000, subtype="FLOAT")
    sf.write(folder / "left.wav", left, 16000, subtype="FLOAT")
    sf.write(folder / "right.wav", right, 16000, subtype="FLOAT")
    sf.write(folder / "mono.wav", left, 16000, subtype="FLOAT")
    return folder


def _run(model: Path, *args: str, input: bytes | None = None):
    return CliRunner().invoke(main, ["transcribe", *args, "--model", str(model), *FAST], input=input)


def _segments(path: Path) -> list[dict]:
    return json.loads(path.read_text())["segments"]


def test_load_audio_takes_one_channel_of_a_file_or_of_bytes(calls: Path) -> None:
    left, right = sf.read(calls / "left.wav", dtype="float32")[0], sf.read(calls / "right.wav", dtype="float32")[0]
    np.testing.assert_array_equal(load_audio(calls / "talk.wav", channel=0), left)
    np.testing.assert_array_equal(load_audio(calls / "talk.wav", channel=1), right)
    np.testing.assert_allclose(load_audio(calls / "talk.wav"), (left + right) / 2, atol=1e-7)
    data = (calls / "talk.wav").read_bytes()
    np.testing.assert_array_equal(load_audio_bytes(data, channel=1), right)
    np.testing.assert_array_equal(load_audio(data), load_audio(calls / "talk.wav"))
    with pytest.raises(ChannelError, match=r"mono.wav: mono audio has no channel 1$") as caught:
        load_audio(calls / "mono.wav", channel=1)
    assert caught.value.channels == 1
    with pytest.raises(ChannelError, match="2-channel audio has no channel 2"):
        load_audio_bytes(data, channel=2)
    with pytest.raises(ValueError, match="channel must be None or an integer >= 0"):
        load_audio(calls / "talk.wav", channel=-1)
    with pytest.raises(ValueError, match="index the channel of an array yourself"):
        load_audio(left, channel=0)


def test_load_audio_bytes_gives_one_line_errors() -> None:
    with pytest.raises(AudioError, match=r"^<stdin>: no audio data \(0 bytes\)$"):
        load_audio_bytes(b"")
    with pytest.raises(AudioError, match=r"^pipe: not a readable audio file") as caught:
        load_audio_bytes(b"this is not audio at all" * 10, name="pipe")
    assert "\n" not in str(caught.value)


def test_stdin_is_transcribed_like_the_file_and_named_stdin(tiny_whisper_folder: Path, calls: Path,
                                                           tmp_path: Path) -> None:
    from_file = _run(tiny_whisper_folder, str(calls / "left.wav"), "-o", str(tmp_path / "file"), "-f", "json")
    assert from_file.exit_code == 0, from_file.output
    piped = _run(tiny_whisper_folder, "-", "-o", str(tmp_path / "pipe"), "-f", "all",
                 input=(calls / "left.wav").read_bytes())
    assert piped.exit_code == 0, piped.output
    assert sorted(p.name for p in (tmp_path / "pipe").iterdir()) == [f"stdin.{f}" for f in
                                                                   ("json", "srt", "tsv", "txt", "vtt")]
    assert _segments(tmp_path / "pipe" / "stdin.json") == _segments(tmp_path / "file" / "left.json")


def test_empty_stdin_is_a_one_line_error(tiny_whisper_folder: Path) -> None:
    result = _run(tiny_whisper_folder, "-", input=b"")
    assert result.exit_code == 1
    assert "error: <stdin>: no audio data (0 bytes)\n" in result.stderr
    assert result.stdout == ""


def test_split_stereo_refuses_more_than_two_channels(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    """5.1 audio holds its speech in the centre channel: left and right alone would miss it."""
    surround = tmp_path / "surround.wav"
    sf.write(surround, np.random.default_rng(0).normal(0, 0.1, (16000, 6)).astype(np.float32), 16000)
    for args, name, data in (([str(surround)], str(surround), None), (["-"], "<stdin>", surround.read_bytes())):
        result = _run(tiny_whisper_folder, *args, "--split-stereo", input=data)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert f"error: {name}: --split-stereo needs stereo audio, this is 6-channel\n" in result.stderr


def test_split_stereo_writes_each_channel_as_its_mono_file_would_be(tiny_whisper_folder: Path, calls: Path,
                                                                   tmp_path: Path) -> None:
    split = _run(tiny_whisper_folder, str(calls / "talk.wav"), str(calls / "mono.wav"), "--split-stereo",
                 "-o", str(tmp_path / "split"), "-f", "json")
    # The mono file is a one-line error; the stereo one is still written.
    assert split.exit_code == 1
    assert "error: " + str(calls / "mono.wav") + ": --split-stereo needs stereo audio, this is mono\n" in split.stderr
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == ["talk.left.json", "talk.right.json"]
    alone = _run(tiny_whisper_folder, str(calls / "left.wav"), str(calls / "right.wav"), "-o", str(tmp_path / "alone"),
                 "-f", "json")
    assert alone.exit_code == 0, alone.output
    left, right = _segments(tmp_path / "split" / "talk.left.json"), _segments(tmp_path / "split" / "talk.right.json")
    assert left == _segments(tmp_path / "alone" / "left.json")
    assert right == _segments(tmp_path / "alone" / "right.json")
    assert left != right  # two different channels, not one mix written twice


def test_split_stereo_from_stdin_to_stdout_heads_each_channel(tiny_whisper_folder: Path, calls: Path,
                                                             tmp_path: Path) -> None:
    result = _run(tiny_whisper_folder, "-", "--split-stereo", "-f", "json", input=(calls / "talk.wav").read_bytes())
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [lines[0], lines[2]] == ["==> stdin.left <==", "==> stdin.right <=="] and len(lines) == 4
    alone = _run(tiny_whisper_folder, str(calls / "right.wav"), "-o", str(tmp_path), "-f", "json")
    assert alone.exit_code == 0, alone.output
    assert json.loads(lines[3])["segments"] == _segments(tmp_path / "right.json")


def test_layout_options_shape_the_srt_written(tiny_whisper_folder: Path, calls: Path, tmp_path: Path) -> None:
    result = _run(tiny_whisper_folder, str(calls / "right.wav"), "-o", str(tmp_path), "-f", "all",
                  "--max-line-width", "8", "--max-line-count", "1", "--max-words-per-line", "3")
    assert result.exit_code == 0, result.output
    assert "warning: --max-words-per-line has no effect with --max-line-width\n" in result.stderr
    segments = [Segment(**{**s, "words": [Word(**w) for w in s["words"]]}) for s in _segments(tmp_path / "right.json")]
    assert any(s.words for s in segments), "the tiny model gave no words to lay out"
    transcript = Transcript("", "en", segments, TranscriptionStats())
    srt = (tmp_path / "right.srt").read_text()
    assert srt == _srt_text(transcript, SubtitleOptions(max_line_width=8, max_line_count=1))
    for block in srt.strip().split("\n\n"):
        text = block.split("\n")[2:]
        assert len(text) == 1 and (len(text[0]) <= 8 or " " not in text[0])


def _srt_text(transcript: Transcript, options: SubtitleOptions) -> str:
    import io

    out = io.StringIO()
    write_srt(transcript, out, options)
    return out.getvalue()


@pytest.mark.parametrize(("args", "message"), [
    (["--max-line-width", "0"], "Error: --max-line-width must be a positive integer, got 0"),
    (["--max-line-count", "-2", "--max-line-width", "5"], "Error: --max-line-count must be a positive integer, got -2"),
    (["--max-words-per-line", "0"], "Error: --max-words-per-line must be a positive integer, got 0"),
])
def test_bad_layout_values_are_one_line_errors(calls: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(calls / "left.wav"), "--word-timestamps", *args])
    assert result.exit_code == 1 and result.output == message + "\n"


@pytest.mark.parametrize("option", [["--highlight-words"], ["--max-line-width", "20"], ["--max-words-per-line", "2"]])
def test_layout_without_word_timestamps_is_a_one_line_error(calls: Path, option: list[str]) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(calls / "left.wav"), "-f", "srt", *option])
    assert result.exit_code == 1
    assert result.output == f"Error: {option[0]} lays out cues by word times: add --word-timestamps\n"


_FAKE_FFMPEG = '''#!{python}
"""Stands in for ffmpeg: decodes b"FAKE" + channel count + interleaved float32, writes what load_audio asks."""
import struct, sys
import numpy as np
args = sys.argv[1:]
source = args[args.index("-i") + 1]
data = sys.stdin.buffer.read() if source == "pipe:0" else open(source, "rb").read()
if not data.startswith(b"FAKE"):
    sys.stderr.write("first line\\npipe:0: Invalid data found when processing input\\n")
    sys.exit(1)
samples = np.frombuffer(data[5:], "<f4").reshape(-1, data[4])
if args[args.index("-f") + 1] == "f32le":
    sys.stdout.buffer.write(samples.mean(axis=1).astype("<f4").tobytes())
    sys.exit(0)
fmt = struct.pack("<HHIIHH", 3, data[4], 16000, 64000 * data[4], 4 * data[4], 32)
# As ffmpeg writes to a pipe: sizes it cannot fill in, and a metadata chunk of odd size (padded) first.
sys.stdout.buffer.write(b"RIFF\\xff\\xff\\xff\\xffWAVEfmt " + struct.pack("<I", len(fmt)) + fmt
                        + b"LIST\\x05\\x00\\x00\\x00abcde\\x00data\\xff\\xff\\xff\\xff" + samples.tobytes())
'''


def test_ffmpeg_decodes_piped_bytes_and_gives_one_channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text(_FAKE_FFMPEG.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    rng = np.random.default_rng(1)
    stereo = rng.uniform(-0.5, 0.5, (16000, 2)).astype(np.float32)
    data = b"FAKE\x02" + stereo.tobytes()
    np.testing.assert_array_equal(load_audio_bytes(data, channel=1), stereo[:, 1])
    np.testing.assert_array_equal(load_audio_bytes(data, channel=0), stereo[:, 0])
    np.testing.assert_allclose(load_audio_bytes(data), stereo.mean(axis=1), atol=1e-7)
    (tmp_path / "call.m4a").write_bytes(data)
    np.testing.assert_array_equal(load_audio(tmp_path / "call.m4a", channel=1), stereo[:, 1])
    with pytest.raises(ChannelError, match=r"^<stdin>: mono audio has no channel 1$"):
        load_audio_bytes(b"FAKE\x01" + stereo[:, 0].tobytes(), channel=1)
    with pytest.raises(AudioError, match=r"^<stdin>: not a readable audio file \(ffmpeg: pipe:0: Invalid data found "
                                         r"when processing input\)$"):
        load_audio_bytes(b"not audio" * 20)


def test_standard_input_given_twice_is_refused(calls: Path) -> None:
    result = CliRunner().invoke(main, ["transcribe", "-", str(calls / "left.wav"), "-"], input=b"")
    assert result.exit_code == 1 and result.output == "Error: standard input (-) can be read once: give - once\n"


def test_standard_input_is_refused_early_when_it_is_not_audio_or_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """1.5 GB of zeros on a pipe once took 2 GB of memory before its error; an endless pipe grew without end."""
    import io

    from asr.cli.transcribe_io import read_stdin
    from audio import AudioError

    monkeypatch.setattr("shutil.which", lambda name: None)  # no ffmpeg: the first bytes tell
    zeros = io.BytesIO(bytes(50 * 2 ** 20))
    with pytest.raises(AudioError, match="<stdin>: not a readable audio file"):
        read_stdin(zeros)
    assert zeros.tell() <= 2 ** 20  # refused after its first MiB
    wav = io.BytesIO()
    sf.write(wav, np.zeros(16000 * 120, dtype=np.float32), 16000, format="WAV", subtype="PCM_16")
    data = wav.getvalue()
    assert read_stdin(io.BytesIO(data)) == data
    with pytest.raises(AudioError, match="more than .* GiB of audio on standard input; give the file's path"):
        read_stdin(io.BytesIO(data), limit=len(data) - 1)
