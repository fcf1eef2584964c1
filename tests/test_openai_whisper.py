"""openai-whisper as the referee (docs/parity.md): the converted weights, its `transcribe()` beside ours, and the
`openai-whisper` configuration of `asr eval`. Skipped where openai-whisper is not installed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from eval.configs import EvalConfig, parse_config
from tests.conftest import manifest

whisper = pytest.importorskip("whisper")


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory):
    """A random two-layer Whisper with openai-whisper's proportions (feed-forward 4 x d_model) and base's
    tokenizer."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from asr.models.registry import load_model
    from tests.test_ct2 import BASE_VOCAB
    from tests.test_registry import save_processor

    torch.manual_seed(5)
    config = WhisperConfig(vocab_size=BASE_VOCAB, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                           decoder_ffn_dim=256)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # random biases everywhere, so a bias in the wrong place would show
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_()
    folder = tmp_path_factory.mktemp("tiny-openai-proportions")
    model.save_pretrained(folder)
    save_processor(folder)
    return load_model(str(folder))


def test_a_model_openai_whisper_cannot_build_is_a_reason_not_a_traceback(tiny_whisper_folder: Path) -> None:
    from asr.models.registry import load_model
    from eval.backends.decoded import BackendUnavailable
    from eval.backends.openai_whisper import openai_whisper_model

    with pytest.raises(BackendUnavailable, match="4 x d_model"):
        openai_whisper_model(load_model(str(tiny_whisper_folder)))


def test_the_converted_model_computes_what_ours_computes(tiny_bundle) -> None:
    from eval.backends.openai_whisper import openai_whisper_checkpoint, openai_whisper_model

    model = openai_whisper_model(tiny_bundle)
    features = torch.randn(1, tiny_bundle.n_mels, 3000)
    tokens = torch.tensor([[50258, 50259, 50359, 50364, 400, 1000, 2000]])
    with torch.inference_mode():
        theirs = model.logits(tokens, model.embed_audio(features))
        ours = tiny_bundle.model(input_features=features, decoder_input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    # Every weight of their layout is filled, and the checkpoint loads as `whisper.load_model` loads one.
    checkpoint = openai_whisper_checkpoint(tiny_bundle)
    assert set(checkpoint["model_state_dict"]) == set(model.state_dict()) - {"alignment_heads"}
    heads = model.alignment_heads.to_dense().nonzero().tolist()
    assert sorted(map(tuple, heads)) == sorted(tiny_bundle.alignment_heads)


def test_the_openai_whisper_configuration_transcribes_with_its_own_code(tiny_bundle) -> None:
    from eval.backends.openai_whisper import OpenAIWhisperBackend

    config = parse_config("openai-whisper,temperature=0")
    assert config == EvalConfig("openai-whisper,temperature=0", "openai-whisper", temperature=0.0)
    samples = np.random.default_rng(0).standard_normal(16000 * 3).astype(np.float32) * 0.1
    decoded = OpenAIWhisperBackend(config, tiny_bundle, "cpu").decode(samples, "en")
    expected = whisper.transcribe(OpenAIWhisperBackend(config, tiny_bundle, "cpu").model, samples, language="en",
                                  temperature=0.0, fp16=False, verbose=None)
    assert decoded.text == expected["text"] and decoded.language == "en"
    assert decoded.generated_tokens == sum(len(s["tokens"]) for s in expected["segments"])


# FLEURS clips whose words changed with the features' padding (docs/parity.md), one per language.
PARTED = ("fleurs-en-004.ogg", "fleurs-de-001.ogg", "fleurs-fr-000.ogg", "fleurs-es-000.ogg", "fleurs-pt-002.ogg")


@pytest.fixture(scope="module")
def base_referee(base):
    """openai-whisper on base's weights."""
    from eval.backends.openai_whisper import openai_whisper_model

    return openai_whisper_model(base)


@pytest.mark.parametrize("name", PARTED)
def test_greedy_gives_openai_whispers_words_on_real_speech(base, base_referee, name: str) -> None:
    from asr.options import TranscribeOptions
    from asr.transcription import transcribe
    from audio import load_audio

    row = next(r for r in manifest("fleurs") if r["audio"] == name)
    samples = load_audio(row["path"])
    ours = transcribe(base, samples, replace(TranscribeOptions(), temperatures=(0.0,), language=row["language"]))
    referee = whisper.transcribe(base_referee, samples, language=row["language"],
                                 temperature=0.0, fp16=False, verbose=None)
    assert ours.text.strip() == referee["text"].strip()
    assert [s.tokens for s in ours.segments] == [s["tokens"] for s in referee["segments"]]



def _noise_and_tone(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    return (rng.normal(0, 0.05, t.size) + 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t)).astype(np.float32)


# (seconds, options): one window, two windows, clips (a window's timestamps may overshoot the next clip's start),
# prompts, no previous text, no timestamps, word timestamps and the hallucination check.
RULE_CASES = [
    (7, {}), (37, {}), (6, {"clip_timestamps": (0.0, 2.0, 2.5)}), (12, {"clip_timestamps": (1.0, 4.0, 4.2, 9.0)}),
    (9, {"initial_prompt": " Hello there."}), (8, {"without_timestamps": True}),
    (45, {"initial_prompt": " Hello there.", "carry_initial_prompt": True}),
    (40, {"condition_on_previous_text": False}), (10, {"word_timestamps": True}),
    (33, {"word_timestamps": True, "hallucination_silence_threshold": 1.0}),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", range(len(RULE_CASES)))
def test_a_random_model_decodes_as_openai_whisper_decodes_it(tiny_bundle, seed: int, case: int) -> None:
    """Whatever a model says, the rules that turn it into windows and segments are openai-whisper's: the same
    tokens and seeks, window by window (a random model's ties are far apart, so rounding cannot part them)."""
    from asr.options import TranscribeOptions
    from asr.transcription import transcribe
    from eval.backends.openai_whisper import openai_whisper_model

    seconds, options = RULE_CASES[case]
    samples = _noise_and_tone(seconds, seed)
    theirs = whisper.transcribe(openai_whisper_model(tiny_bundle), samples, language="en", temperature=0.0,
                                fp16=False, verbose=None,
                                **{k: (",".join(map(str, v)) if k == "clip_timestamps" else v)
                                   for k, v in options.items()})
    ours_options = dict(options)
    if ours_options.pop("without_timestamps", False):
        ours_options["timestamps"] = False
    ours = transcribe(tiny_bundle, samples, TranscribeOptions(language="en", temperatures=(0.0,), **ours_options))
    kept = [s for s in theirs["segments"] if s["tokens"]]  # openai-whisper keeps empty segments, cleared
    assert [(s.seek, s.tokens) for s in ours.segments] == [(s["seek"], s["tokens"]) for s in kept]
    if options.get("word_timestamps"):
        assert [(w.word, w.start, w.end) for s in ours.segments for w in s.words] == [
            (w["word"], w["start"], w["end"]) for s in kept for w in s["words"]]


@pytest.mark.parametrize("folder,name", [("clips", "jfk.flac"), ("longform", "p002.mp3")])
def test_word_timestamps_are_openai_whispers_on_real_speech(base, base_referee, folder: str, name: str) -> None:
    """With word timestamps each window after the first starts at the last word's end, so the words of a long
    recording depend on the word times being openai-whisper's."""
    from asr.options import TranscribeOptions
    from asr.transcription import transcribe
    from audio import load_audio

    row = next(r for r in manifest(folder) if r["audio"] == name)
    samples = load_audio(row["path"])
    ours = transcribe(base, samples, TranscribeOptions(temperatures=(0.0,), language="en", word_timestamps=True))
    referee = whisper.transcribe(base_referee, samples, language="en", temperature=0.0, fp16=False, verbose=None,
                                 word_timestamps=True)
    kept = [s for s in referee["segments"] if s["tokens"]]
    assert [(s.seek, s.tokens) for s in ours.segments] == [(s["seek"], s["tokens"]) for s in kept]
    ours_words = [(w.word, w.start, w.end) for s in ours.segments for w in s.words]
    theirs = [(w["word"], w["start"], w["end"]) for s in kept for w in s["words"]]
    assert [w[0] for w in ours_words] == [w[0] for w in theirs]
    # Times to the centisecond: the attention weights of the two implementations differ in rounding only.
    assert max(abs(a[1] - b[1]) + abs(a[2] - b[2]) for a, b in zip(ours_words, theirs)) <= 0.02
