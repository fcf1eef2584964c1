"""asr.whisper.draft_step: a drafting decoder's step as one native call, close to the layers it replaces."""

from __future__ import annotations

import pytest
import torch

from asr.assist.assistants import low_precision_decoder
from asr.models.int8 import Int8Linear
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.draft_step import NativeDraftStep
from decoding import kernels, native
from tests.conftest import SAMPLES
from tests.test_ct2 import tiny_whisper

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler to build decoding.native")

PROMPT = torch.tensor([[50258, 50259, 50359, 50363, 400]])


def _encoder_output(model: torch.nn.Module, seed: int, batch: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.inference_mode():
        return model.get_encoder()(torch.randn(batch, 80, 3000)).last_hidden_state


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_native_step_gives_the_layers_logits_and_cache(precision: str, seed: int) -> None:
    model = tiny_whisper(seed=seed)
    copy, _ = low_precision_decoder(model, precision)
    encoder_output = _encoder_output(model, seed)
    plain, fused = WhisperDecoderAdapter(copy, encoder_output), WhisperDecoderAdapter(copy, encoder_output,
                                                                                       drafting=True)
    plain_cache, fused_cache = plain.new_cache(1), fused.new_cache(1)
    plain.forward(PROMPT, plain_cache, 1)
    fused.forward(PROMPT, fused_cache, 1)
    generator = torch.Generator().manual_seed(seed)
    for width in (1, 2, 3, 4, 1, 2):
        ids = torch.randint(0, 50257, (1, width), generator=generator)
        expected = plain.forward(ids, plain_cache, width)
        got = fused.forward(ids, fused_cache, width)
        assert got.shape == expected.shape
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(got))
        # Only the rounding of the cross-attention keys and values to bfloat16 and the sums' order differ.
        assert (got[finite] - expected[finite]).abs().max() < 2e-2 * expected[finite].abs().max()
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert isinstance(fused._native_step, NativeDraftStep)
    length = plain_cache.length
    assert fused_cache.length == length
    for name in ("keys", "values"):
        a, b = getattr(plain_cache, name)[..., :length, :], getattr(fused_cache, name)[..., :length, :]
        assert (a - b).abs().max() < 2e-2 * a.abs().max()


def test_the_model_batches_and_onednn_only_keep_the_layers() -> None:
    model = tiny_whisper(seed=4)
    copy, _ = low_precision_decoder(model, "int8")
    one, two = _encoder_output(model, 4), _encoder_output(model, 4, batch=2)
    own = WhisperDecoderAdapter(copy, one)  # not drafting: a model's steps keep their own bits
    cache = own.new_cache(1)
    own.forward(PROMPT, cache, 1)
    own.forward(torch.tensor([[500]]), cache, 1)
    assert own._native_step is None
    assert NativeDraftStep.for_adapter(WhisperDecoderAdapter(copy, two, drafting=True), copy) is None
    assert NativeDraftStep.for_adapter(WhisperDecoderAdapter(copy, one, drafting=True), copy) is not None
    with kernels.onednn_only():
        assert NativeDraftStep.for_adapter(WhisperDecoderAdapter(copy, one, drafting=True), copy) is None
    pair = WhisperDecoderAdapter(copy, two, drafting=True)
    assert pair.rows([1])._drafting_step() is not None  # one window of two: its own keys and values


def test_a_small_int8_copy_keeps_its_dequantized_weights_for_prompts() -> None:
    model = tiny_whisper(seed=5)
    copy, _ = low_precision_decoder(model, "int8")
    linear = copy.get_decoder().layers[0].fc1
    assert isinstance(linear, Int8Linear)
    x = torch.randn(300, linear.in_features)  # many rows: the dequantised bfloat16 product
    first = linear(x)
    kept = linear.__dict__.get("_kept")
    assert kept is not None and kept.dtype == torch.bfloat16
    assert torch.equal(linear(x), first)
    assert linear._dequantized() is kept


def test_assisted_decoding_over_the_native_step_gives_the_models_words(tiny_whisper_folder, monkeypatch) -> None:
    from asr.assist.choose import make_assistant
    from asr.longform import transcribe
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    calls = []
    step = NativeDraftStep.__call__
    monkeypatch.setattr(NativeDraftStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    bundle = load_model(str(tiny_whisper_folder))
    options = TranscribeOptions(language="en", temperatures=(0.0,))
    audio = str(SAMPLES / "park.flac")
    plain = transcribe(bundle, audio, options)
    for spec in ("self:int8", "self:fp32"):
        assisted = transcribe(bundle, audio, options, assistant=make_assistant(spec, bundle))
        assert [s.tokens for s in assisted.segments] == [s.tokens for s in plain.segments]
        assert assisted.text == plain.text
    assert calls
