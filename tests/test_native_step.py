"""decoding.kernels.native_step: a decoder's step as one native call, close to the layers it replaces, each row on
its own."""

from __future__ import annotations

import pytest
import torch

from asr.assist.assistants import low_precision_decoder
from asr.whisper.decoder import WhisperDecoderAdapter
from decoding.kernels import native, products
from decoding.kernels.int8 import Int8Linear
from decoding.kernels.native_step import STEP_ROWS, NativeStep
from tests.conftest import SAMPLES
from tests.test_ct2 import tiny_whisper

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler to build decoding.kernels.native")

PROMPT = torch.tensor([[50258, 50259, 50359, 50363, 400]])


def _encoder_output(model: torch.nn.Module, seed: int, batch: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.inference_mode():
        return model.get_encoder()(torch.randn(batch, 80, 3000)).last_hidden_state


def _decoders(model: torch.nn.Module, precision: str, encoder_output: torch.Tensor):
    """A decoder through its layers and the same decoder through the native step: the model's own or the int8
    model's (float32 keys and values) or a drafting copy's (int8 or float32 weights, bfloat16 cross-attention)."""
    if precision in ("model", "int8 model"):
        if precision == "int8 model":
            from asr.models.precision import quantize_model

            model = quantize_model(model)
        layers, native_step = (WhisperDecoderAdapter(model, encoder_output) for _ in range(2))
    else:
        model, _ = low_precision_decoder(model, precision)
        layers = WhisperDecoderAdapter(model, encoder_output, drafting=True)
        native_step = WhisperDecoderAdapter(model, encoder_output, drafting=True)
    layers._native_step = False  # never built: every pass through the layers
    return layers, native_step


@pytest.mark.parametrize("precision", ["model", "int8 model", "fp32", "int8"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_native_step_gives_the_layers_logits_and_cache(precision: str, seed: int) -> None:
    model = tiny_whisper(seed=seed)
    encoder_output = _encoder_output(model, seed)
    plain, fused = _decoders(model, precision, encoder_output)
    plain_cache, fused_cache = plain.new_cache(1), fused.new_cache(1)
    plain.forward(PROMPT, plain_cache, 1)
    fused.forward(PROMPT, fused_cache, 1)
    generator = torch.Generator().manual_seed(seed)
    # A draft differs by the rounding of its cross-attention keys and values to bfloat16 and the sums' order, the
    # model by the order alone.
    tolerance = 1e-4 if precision in ("model", "int8 model") else 2e-2
    for width in (1, 2, 3, 4, 1, 6, 17, 24, 2):  # the step's row blocks, whole and with a rest
        ids = torch.randint(0, 50257, (1, width), generator=generator)
        expected = plain.forward(ids, plain_cache, width)
        got = fused.forward(ids, fused_cache, width)
        assert got.shape == expected.shape
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(got))
        assert (got[finite] - expected[finite]).abs().max() < tolerance * expected[finite].abs().max()
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert isinstance(fused._native_step, NativeStep)
    length = plain_cache.length
    assert fused_cache.length == length
    for name in ("keys", "values"):
        a, b = getattr(plain_cache, name)[..., :length, :], getattr(fused_cache, name)[..., :length, :]
        assert (a - b).abs().max() < tolerance * a.abs().max()


@pytest.mark.parametrize(("seed", "width"), [(0, 4), (1, 2), (2, 7), (3, 17), (4, STEP_ROWS), (5, 40)])
def test_a_check_of_drafts_gives_each_row_a_one_token_steps_bits(seed: int, width: int) -> None:
    model = tiny_whisper(seed=seed)
    decoder = WhisperDecoderAdapter(model, _encoder_output(model, seed))
    if width > native.MAX_ROWS:  # the rows the head reads; a float32 head of more rows is oneDNN's (screened_head)
        decoder.proj_out = lambda hidden: hidden
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50257, (1, width), generator=generator)
    one, check = decoder.new_cache(1), decoder.new_cache(1)
    decoder.forward(PROMPT, one, 1)
    decoder.forward(PROMPT, check, 1)
    steps = torch.cat([decoder.forward(ids[:, i:i + 1], one, 1) for i in range(width)], dim=1)
    checked = decoder.forward(ids, check, width)
    assert isinstance(decoder._native_step, NativeStep)
    assert torch.equal(checked, steps)
    assert torch.equal(check.keys[..., :one.length, :], one.keys[..., :one.length, :])


def test_a_packed_float32_models_prompt_pass_runs_in_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from asr.models.precision import quantize_model

    model = tiny_whisper(seed=6)
    encoder_output = _encoder_output(model, 6)
    plain, fused = _decoders(model, "model", encoder_output)
    calls = []
    original = NativeStep.__call__
    monkeypatch.setattr(NativeStep, "__call__", lambda step, ids, *rest: calls.append(ids.shape[1]) or
                        original(step, ids, *rest))
    prompt = torch.randint(0, 50257, (1, 60), generator=torch.Generator().manual_seed(6))
    plain_cache, fused_cache = plain.new_cache(1), fused.new_cache(1)
    expected, got = plain.forward(prompt, plain_cache, 1), fused.forward(prompt, fused_cache, 1)
    assert calls == [60] and fused._native_step.takes_prompts
    assert (got - expected).abs().max() < 1e-4 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert (fused_cache.keys[..., :60, :] - plain_cache.keys[..., :60, :]).abs().max() < 1e-4 * \
        plain_cache.keys[..., :60, :].abs().max()
    # A drafting copy's prompt and the int8 model's (bfloat16) stay in the layers.
    calls.clear()
    copy, _ = low_precision_decoder(model, "int8")
    draft = WhisperDecoderAdapter(copy, encoder_output, drafting=True)
    int8_model = quantize_model(tiny_whisper(seed=6))
    int8 = WhisperDecoderAdapter(int8_model, encoder_output)
    for decoder in (draft, int8):
        decoder.forward(prompt, decoder.new_cache(1), 1)
        assert not decoder._native_step.takes_prompts
    assert calls == []


def test_batches_and_onednn_only_keep_the_layers() -> None:
    from asr.models.precision import quantize_model

    model = tiny_whisper(seed=4)
    copy, _ = low_precision_decoder(model, "int8")
    one, two = _encoder_output(model, 4), _encoder_output(model, 4, batch=2)
    # A batch's step is one token a row (`rows_step`), never a pass of several tokens of one window.
    batched = NativeStep.for_adapter(WhisperDecoderAdapter(copy, two, drafting=True), copy, True)
    assert batched is not None and not batched.applies(WhisperDecoderAdapter(copy, two).new_cache(1), 1)
    assert NativeStep.for_adapter(WhisperDecoderAdapter(copy, one, drafting=True), copy, True) is not None
    assert NativeStep.for_adapter(WhisperDecoderAdapter(model, one), model, False) is not None
    with products.onednn_only():
        assert NativeStep.for_adapter(WhisperDecoderAdapter(copy, one, drafting=True), copy, True) is None
    with products.reference_kernels():
        assert NativeStep.for_adapter(WhisperDecoderAdapter(model, one), model, False) is None
    # The int8 model (bfloat16 token table) steps through it at every width decoding meets, not only a few rows.
    int8_model = quantize_model(tiny_whisper(seed=4))
    step = NativeStep.for_adapter(WhisperDecoderAdapter(int8_model, one), int8_model, False)
    assert step is not None and step.max_rows == products.MANY_ROWS - 1 > native.MAX_ROWS
    pair = WhisperDecoderAdapter(copy, two, drafting=True)
    assert pair.rows([1])._step() is not None  # one window of two: its own keys and values


@pytest.mark.parametrize("precision", ["model", "int8 model", "int8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_batchs_step_gives_each_row_its_windows_one_token_step_bits(precision: str, seed: int) -> None:
    """Windows decoded together, prompts of different lengths (left-padded), rows leaving and reordered: each row's
    hidden state is bit for bit its window's own step over the same keys and values."""
    from decoding.ragged import RaggedBatch

    model = tiny_whisper(seed=seed)
    _, batched = _decoders(model, precision, _encoder_output(model, seed, batch=3))
    batched.proj_out = lambda hidden: hidden  # the hidden states, not a head that may group rows differently
    prompts = [[50258, 50259, 50359, 50363], [50258, 50259, 50359, 50363, 400, 401, 402], [50258, 50363, 7]]
    batch = RaggedBatch(batched, 3)
    batch.feed(prompts, 1)
    windows = [0, 1, 2]
    calls = []
    rows_step = NativeStep.rows_step
    generator = torch.Generator().manual_seed(seed)
    for step in range(6):
        if step == 3:  # the middle window finishes, the other two swap places
            batch.select([2, 0])
            windows = [windows[2], windows[0]]
        ids = torch.randint(0, 50257, (len(windows),), generator=generator)
        before = [batch.slots[r][:] for r in range(len(windows))]
        NativeStep.rows_step = lambda self, *a: calls.append(1) or rows_step(self, *a)
        try:
            got = batch.feed([[int(i)] for i in ids], 1)[:, 0]
        finally:
            NativeStep.rows_step = rows_step
        for row, window in enumerate(windows):
            alone = batched.rows([row])
            alone._native_step = None
            cache = alone.new_cache(1)
            slots = torch.tensor(before[row])
            cache.ensure(len(slots) + 1)
            cache.keys[:, 0, :, :len(slots)] = batch.cache.keys[:, row, :, slots]
            cache.values[:, 0, :, :len(slots)] = batch.cache.values[:, row, :, slots]
            cache.length = len(slots)
            expected = alone.forward(ids[row].view(1, 1), cache, 1)[0, 0]
            assert isinstance(alone._native_step, NativeStep)
            assert torch.equal(got[row], expected), (precision, step, window)
    assert len(calls) == 6


def test_the_int8_models_cross_attention_is_bfloat16_values_that_its_step_reads_as_bfloat16() -> None:
    from asr.models.precision import quantize_model

    model = tiny_whisper(seed=6)
    encoder_output = _encoder_output(model, 6)
    float32 = WhisperDecoderAdapter(model, encoder_output)
    int8_model = quantize_model(tiny_whisper(seed=6))
    int8 = WhisperDecoderAdapter(int8_model, encoder_output)
    for adapter, rounded in ((float32, False), (int8, True)):
        values = torch.cat([x.reshape(-1) for pair in adapter.cross for x in pair])
        assert values.dtype == torch.float32
        assert torch.equal(values.to(torch.bfloat16).float(), values) == rounded
        adapter.forward(PROMPT, adapter.new_cache(1), 1)
        step = adapter._step()
        kind = torch.bfloat16 if rounded else torch.float32
        assert step is not None and step.model.cross_kind == native.WEIGHT_KINDS[kind]


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
    from asr.transcription import transcribe
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    calls = []
    step = NativeStep.__call__
    monkeypatch.setattr(NativeStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    bundle = load_model(str(tiny_whisper_folder))
    options = TranscribeOptions(language="en", temperatures=(0.0,))
    audio = str(SAMPLES / "park.flac")
    plain = transcribe(bundle, audio, options)
    for spec in ("self:int8", "self:fp32"):
        assisted = transcribe(bundle, audio, options, assistant=make_assistant(spec, bundle))
        assert [s.tokens for s in assisted.segments] == [s.tokens for s in plain.segments]
        assert assisted.text == plain.text
    assert calls
