"""decoding.kernels.encoder_attention: a bfloat16 encoder's self-attention through AVX512-BF16 (csrc/encoder_attention.c)
and the routing of a transformers encoder to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decoding.kernels import encoder_attention, native
from decoding.kernels.products import reference_kernels

LIBRARY = native.library()
BUILT = LIBRARY is not None and bool(LIBRARY.encoder_attention_available())
needs_kernel = pytest.mark.skipif(not BUILT, reason="no C compiler, or a CPU without AVX512-BF16")


def _operands(batch: int, heads: int, frames: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, frames, 64, generator=generator) for _ in range(3))
    return (q * 2).bfloat16(), k.bfloat16(), v.bfloat16()


@needs_kernel
@pytest.mark.parametrize("batch, heads, frames", [(1, 8, 1500), (2, 3, 37), (1, 2, 16), (1, 1, 5), (1, 1, 1),
                                                  (3, 2, 33)])
def test_the_kernel_is_as_close_to_float32_as_pytorch_bfloat16_attention(batch: int, heads: int, frames: int) -> None:
    q, k, v = _operands(batch, heads, frames, seed=frames)
    got = encoder_attention.attention(q, k, v, 0.125)
    assert got.dtype == torch.bfloat16 and got.shape == (batch, frames, heads, 64)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.125).transpose(1, 2)
    pytorch = F.scaled_dot_product_attention(q, k, v, scale=0.125).transpose(1, 2)
    ours_error = (got.double() - exact).abs()
    theirs_error = (pytorch.double() - exact).abs()
    # Both round the probabilities and the output to bfloat16 (8 bits): errors of that size, alike on average.
    assert ours_error.max() <= 2 * theirs_error.max() + 2.0 ** -8
    assert ours_error.mean() <= 1.25 * theirs_error.mean() + 1e-4


@needs_kernel
def test_each_window_is_the_same_whatever_the_threads_and_the_windows_beside_it() -> None:
    q, k, v = _operands(2, 2, 100, seed=1)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = encoder_attention.attention(q, k, v, 0.125)
        torch.set_num_threads(2)
        two = encoder_attention.attention(q, k, v, 0.125)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)
    # A window of a batch gets the bits it gets alone.
    alone = encoder_attention.attention(q[1:].contiguous(), k[1:].contiguous(), v[1:].contiguous(), 0.125)
    assert torch.equal(alone, one[1:])


def test_the_kernel_takes_only_unmasked_bfloat16_self_attention_over_64_wide_heads() -> None:
    q, k, v = _operands(1, 2, 20, seed=2)
    assert encoder_attention.takes(q, k, v, None, False)
    assert not encoder_attention.takes(q, k, v, torch.ones(1, 1, 20, 20, dtype=torch.bool), False)
    assert not encoder_attention.takes(q, k, v, None, True)
    assert not encoder_attention.takes(q.float(), k.float(), v.float(), None, False)
    assert not encoder_attention.takes(q[..., :32], k[..., :32], v[..., :32], None, False)
    assert not encoder_attention.takes(q[:, :, :1], k, v, None, False)  # a decoder's query over other keys


def test_a_call_the_kernel_does_not_take_is_transformers_sdpa_unchanged() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _operands(1, 2, 20, seed=3)
    module = torch.nn.Module()
    module.is_causal = False
    mask = torch.rand(1, 1, 20, 20, generator=torch.Generator().manual_seed(0)) > 0.3
    for args in [(q, k, v, mask), (q.float(), k.float(), v.float(), None)]:
        got, _ = encoder_attention.attention_forward(module, *args, scaling=0.5)
        expected, _ = sdpa_attention_forward(module, *args, scaling=0.5)
        assert torch.equal(got, expected)
    for switch in (reference_kernels, encoder_attention.pytorch_attention):
        with switch():
            got, _ = encoder_attention.attention_forward(module, q, k, v, None, scaling=0.5)
        assert torch.equal(got, sdpa_attention_forward(module, q, k, v, None, scaling=0.5)[0])


def _whisper(dtype: torch.dtype):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(d_model=128, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80,
                           max_source_positions=50, max_target_positions=32, vocab_size=51865,
                           attn_implementation="sdpa")
    return WhisperForConditionalGeneration(config).eval().to(dtype)


def test_only_a_bfloat16_encoders_self_attention_is_routed_where_the_kernel_pays(monkeypatch) -> None:
    monkeypatch.setattr(encoder_attention, "available", lambda: True)
    model = _whisper(torch.float32)
    assert not encoder_attention.use_native_encoder_attention(model.get_encoder())
    model = _whisper(torch.bfloat16)
    assert encoder_attention.use_native_encoder_attention(model.get_encoder())
    names = {layer.self_attn.config._attn_implementation for layer in model.get_encoder().layers}
    assert names == {encoder_attention.NAME}
    assert model.config._attn_implementation == "sdpa"
    assert model.get_decoder().layers[0].self_attn.config._attn_implementation == "sdpa"
    monkeypatch.setattr(encoder_attention, "available", lambda: False)
    assert not encoder_attention.use_native_encoder_attention(_whisper(torch.bfloat16).get_encoder())


@needs_kernel
def test_a_routed_encoder_gives_what_sdpa_gives_within_bfloat16(monkeypatch) -> None:
    monkeypatch.setattr(encoder_attention, "available", lambda: True)
    model = _whisper(torch.bfloat16)
    features = torch.randn(2, 80, 100, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.inference_mode():
        expected = model.get_encoder()(features).last_hidden_state.float()
        assert encoder_attention.use_native_encoder_attention(model.get_encoder())
        calls = []
        monkeypatch.setattr(encoder_attention, "attention", lambda *a: calls.append(1) or _real_attention(*a))
        got = model.get_encoder()(features).last_hidden_state.float()
    assert len(calls) == 2  # one call a layer, both windows in it
    assert ((got - expected).norm() / expected.norm()) < 0.02


_real_attention = encoder_attention.attention


def test_a_kernel_without_memory_is_a_memory_error_not_garbage(monkeypatch) -> None:
    class Refusing:
        def encoder_attention(self, *args) -> int:
            return -1  # what the C function returns where its buffers cannot be allocated

    monkeypatch.setattr(native, "library", lambda: Refusing())
    q, k, v = _operands(1, 1, 5, seed=5)
    with pytest.raises(MemoryError, match="no memory for the encoder attention"):
        encoder_attention.attention(q, k, v, 0.125)
