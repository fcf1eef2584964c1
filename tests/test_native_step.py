"""decoding.kernels.native_step: a decoder's step as one native call, close to the layers it replaces, each row on
its own."""

from __future__ import annotations

import pytest
import torch

from asr.assist.assistants import low_precision_decoder
from asr.whisper.decoder import WhisperDecoderAdapter
from decoding.kernels import native, products
from decoding.kernels import native_step as native_step_module
from decoding.kernels.int8 import Int8Linear
from decoding.kernels.native_step import STEP_ROWS, NativeStep, int8_prompts_here
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
def test_the_native_step_gives_the_layers_logits_and_cache(precision: str, seed: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Both prompts through the layers: the int8 model's in its step is another test's.
    monkeypatch.setattr(native_step_module, "int8_prompts_here", lambda: False)
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
    # A drafting copy's prompt stays in the layers; the int8 model's (bfloat16 there) too on a CPU with AMX.
    calls.clear()
    copy, _ = low_precision_decoder(model, "int8")
    draft = WhisperDecoderAdapter(copy, encoder_output, drafting=True)
    draft.forward(prompt, draft.new_cache(1), 1)
    assert not draft._native_step.takes_prompts and calls == []
    int8_model = quantize_model(tiny_whisper(seed=6))
    int8 = WhisperDecoderAdapter(int8_model, encoder_output)
    int8.forward(prompt, int8.new_cache(1), 1)
    assert int8._native_step.takes_prompts == int8_prompts_here()
    assert calls == ([60] if int8_prompts_here() else [])


@pytest.mark.parametrize("amx", [False, True])
def test_the_int8_models_prompt_runs_in_its_step_without_amx(amx: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from asr.models.precision import quantize_model

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    model = tiny_whisper(seed=7)
    encoder_output = _encoder_output(model, 7)
    model = quantize_model(model)
    decoder, layers = WhisperDecoderAdapter(model, encoder_output), WhisperDecoderAdapter(model, encoder_output)
    layers._native_step = False
    prompt = torch.randint(0, 50257, (1, 30), generator=torch.Generator().manual_seed(7))
    got, expected = decoder.forward(prompt, decoder.new_cache(1), 1), layers.forward(prompt, layers.new_cache(1), 1)
    assert decoder._native_step.takes_prompts == (not amx) == decoder.prompt_takes_steps(30)
    # The step's int8 products against the layers' bfloat16 ones: close, not equal.
    assert (got - expected).abs().max() < 2e-2 * expected.abs().max()


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


@pytest.mark.parametrize(("seed", "k", "logits_at", "int8"),
                         [(0, 0, None, False), (1, 0, -1, False), (2, 0, -3, False), (3, 3, None, False),
                          (4, 1, -3, False), (5, 0, -3, True), (6, 3, None, True)])
def test_a_prompt_fed_with_the_first_check_changes_no_bit(seed: int, k: int, logits_at: int | None, int8: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder whose prompt runs in its step (packed float32; the int8 model without AMX) takes a lone prompt
    whole with the first drafts (`prompt_takes_steps`): the tokens, log-probabilities and prompt logits of
    prefilling it first, bit for bit, in one pass fewer. At most 4 rows of logits a pass, as more are oneDNN's head,
    whose sums depend on the rows."""
    from asr.models.precision import quantize_model
    from decoding import GenerationOptions, ReferenceDraft, generate

    if int8 and not int8_prompts_here():
        pytest.skip("the int8 model's prompt runs in bfloat16 on a CPU with AMX")
    model = tiny_whisper(seed=seed)
    encoder_output = _encoder_output(model, seed)
    model = quantize_model(model) if int8 else model
    generator = torch.Generator().manual_seed(seed)
    prompt = PROMPT[0, :4].tolist() + torch.randint(0, 50257, (20,), generator=generator).tolist()
    options = GenerationOptions(max_new_tokens=24, prompt_logits_at=logits_at, schedule="constant",
                                num_assistant_tokens=max(k, 1))

    def run(fused: bool, reference: list[int] | None):
        if not fused:
            monkeypatch.setattr(WhisperDecoderAdapter, "prompt_takes_steps", lambda self, width: False)
        draft = ReferenceDraft(reference) if reference is not None else None
        result = generate(WhisperDecoderAdapter(model, encoder_output), prompt, options, draft)
        monkeypatch.undo()
        return result

    reference = None
    if k:  # the model's own tokens with one changed: drafts kept, one rejected, the reference found again
        reference = run(False, None).tokens
        reference[10] = (reference[10] + 1) % 50257
    first, fused = run(False, reference), run(True, reference)
    assert fused.tokens == first.tokens and fused.logprobs == first.logprobs
    assert fused.stats.model_forward_passes == first.stats.model_forward_passes - 1
    if logits_at is not None:
        assert torch.equal(fused.prompt_logits, first.prompt_logits)
    if k:
        assert fused.stats.accepted_tokens == first.stats.accepted_tokens > 0


@pytest.mark.parametrize("fused", [True, False])
def test_prompt_logits_outside_the_prompt_are_one_clear_error(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from decoding import GenerationOptions, generate

    model = tiny_whisper(seed=8)
    decoder = WhisperDecoderAdapter(model, _encoder_output(model, 8))
    if not fused:
        monkeypatch.setattr(WhisperDecoderAdapter, "prompt_takes_steps", lambda self, width: False)
    assert decoder.prompt_takes_steps(4) == fused
    with pytest.raises(ValueError, match=r"^prompt_logits_at=-9 is outside a prompt of 4 tokens$"):
        generate(decoder, PROMPT[0, :4].tolist(), GenerationOptions(max_new_tokens=2, prompt_logits_at=-9))


@pytest.mark.parametrize("seed, length", [(0, 6), (1, 120)])
def test_an_int8_batchs_prompt_gives_each_row_its_windows_numbers_alone(seed: int, length: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a window's prompt alone runs in the int8 model's step (no AMX), a batch's prompt pass (prompts of
    different lengths, left-padded; 3 x 120 rows past `MANY_ROWS`) runs each row through its window's step: the
    bits of each window alone, its keys and values in the row's slots. Through the layers' bfloat16 products they
    were ~1.5e-3 apart, which flipped a near tie in `asr serve`'s int8 answers."""
    from asr.models.precision import quantize_model
    from decoding.ragged import RaggedBatch

    monkeypatch.setattr(native_step_module, "int8_prompts_here", lambda: True)
    model = tiny_whisper(seed=seed)
    encoder_output = _encoder_output(model, seed, batch=3)
    model = quantize_model(model)
    batched = WhisperDecoderAdapter(model, encoder_output)
    batched.proj_out = lambda hidden: hidden
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 50257, (n,), generator=generator).tolist() for n in (length, length + 3, 2)]
    batch = RaggedBatch(batched, 3)
    got = batch.feed(prompts, 1)[:, 0]
    windows = []
    for row, prompt in enumerate(prompts):
        alone = batched.rows([row])
        alone._native_step = None
        cache = alone.new_cache(1)
        expected = alone.forward(torch.tensor([prompt]), cache, 1)[0, 0]
        assert alone._native_step.takes_prompts
        assert torch.equal(got[row], expected), row
        slots = torch.tensor(batch.slots[row])
        assert torch.equal(batch.cache.keys[:, row, :, slots], cache.keys[:, 0, :, :len(prompt)])
        assert torch.equal(batch.cache.values[:, row, :, slots], cache.values[:, 0, :, :len(prompt)])
        windows.append((alone, cache))
    # The step after it, every row in one native call over its slots (`rows_step`): each window's step alone.
    got = batch.feed([[7], [8], [9]], 1)[:, 0]
    for row, (alone, cache) in enumerate(windows):
        assert torch.equal(got[row], alone.forward(torch.tensor([[7 + row]]), cache, 1)[0, 0]), row
