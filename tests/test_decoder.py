"""The Whisper decoder adapter against transformers' own decoder forward, on the real base model."""

from __future__ import annotations

import torch

from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode
from audio import load_audio
from audio.features import log_mel, pad_or_trim
from decoding.kernels.products import reference_kernels
from tests.conftest import evaldata


class _TransformersDecoder:
    """transformers' own decoder forward with its own cache, fed the same chunks as the adapter."""

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor) -> None:
        from transformers import DynamicCache, EncoderDecoderCache

        self.model, self.encoder_output = model, encoder_output
        self.cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))

    @torch.inference_mode()
    def forward(self, ids: list[int]) -> torch.Tensor:
        hidden = self.model.get_decoder()(input_ids=torch.tensor([ids]), encoder_hidden_states=self.encoder_output,
                                          cache=self.cache, use_cache=True).last_hidden_state
        return self.model.get_output_embeddings()(hidden)[0]

    def crop(self, length: int) -> None:
        self.cache.crop(length - self.cache.get_seq_length())


def test_the_adapter_gives_transformers_logits_bit_for_bit(base) -> None:
    # With PyTorch's default kernels on both sides; the oneDNN kernels are checked against them below.
    with reference_kernels():
        stepwise, wide, expected, expected_wide = _adapter_and_transformers(base)
    # Different cache layouts, same arithmetic: the same bits, not merely close ones.
    assert torch.equal(stepwise, expected)
    assert torch.equal(wide, expected_wide)


def test_the_default_kernels_give_the_same_tokens_and_close_logits(base) -> None:
    stepwise, wide, expected, expected_wide = _adapter_and_transformers(base)
    with reference_kernels():
        reference = _adapter_and_transformers(base)
    for fast, slow in zip((stepwise, wide, expected, expected_wide), reference):
        assert torch.allclose(fast, slow, atol=2e-3, rtol=1e-3)
        assert torch.equal(fast.argmax(-1), slow.argmax(-1))


def _adapter_and_transformers(base) -> tuple[torch.Tensor, ...]:
    """Logits of 8 greedy steps and of a 5-token check, from the adapter and from transformers."""
    model, special = base.model, base.special
    audio = load_audio(evaldata("clips", "jfk.flac"))
    encoder_output = encode(model, log_mel(pad_or_trim(audio), base.n_mels))
    adapter = WhisperDecoderAdapter(model, encoder_output)
    cache = adapter.new_cache(1)
    prompt = [special.sot, special.languages["en"], special.transcribe, special.no_timestamps]
    tokens = list(prompt)
    logits = [adapter.forward(torch.tensor([prompt]), cache, len(prompt))[0]]
    for _ in range(8):  # one token per pass, greedily
        tokens.append(int(logits[-1][-1].argmax()))
        logits.append(adapter.forward(torch.tensor([tokens[-1:]]), cache, 1)[0])
    stepwise = torch.cat(logits)[:-1]
    # Rolled back to after the prompt, then five tokens checked in one pass (as when verifying drafts).
    adapter.crop(cache, len(prompt) + 2)
    wide = adapter.forward(torch.tensor([tokens[len(prompt) + 2: len(prompt) + 7]]), cache, 5)[0]

    reference = _TransformersDecoder(model, encoder_output)
    expected = [reference.forward(prompt)] + [reference.forward([t]) for t in tokens[len(prompt):-1]]
    reference.crop(len(prompt) + 2)
    expected_wide = reference.forward(tokens[len(prompt) + 2: len(prompt) + 7])

    assert base.tokenizer.decode(tokens[len(prompt):]).strip().startswith("And so my fellow Americans")
    return stepwise, wide, torch.cat(expected), expected_wide


def test_int8_linear_matches_its_dequantised_weights() -> None:
    from asr.models.int8 import quantize_linears
    from decoding.kernels.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96)
    quantized = Int8Linear(linear)
    x = torch.randn(2, 3, 64)
    dequantised = quantized.weight.float() * quantized.scale.float()[:, None]
    expected = torch.nn.functional.linear(x.bfloat16().float(), dequantised, linear.bias.detach())
    assert quantized(x).shape == (2, 3, 96)
    assert torch.allclose(quantized(x).float(), expected, atol=0.05, rtol=0.02)
    # Per-row scales: every row of the int8 weight uses the full range.
    assert (quantized.weight.abs().amax(dim=1) == 127).all()
    module = quantize_linears(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 4))))
    assert [type(m).__name__ for m in module.modules()].count("Int8Linear") == 2


def test_fused_qkv_copy_gives_the_same_logits(base) -> None:
    import copy

    from asr.assist.assistants import fuse_layer_qkv

    model = base.model
    encoder_output = torch.randn(1, 1500, model.config.d_model)
    fused = copy.deepcopy(model)
    for layer in fused.get_decoder().layers:
        fuse_layer_qkv(layer)
    ids = torch.tensor([[base.special.sot, base.special.languages["en"], base.special.transcribe, 400, 401]])
    plain = WhisperDecoderAdapter(model, encoder_output)
    joined = WhisperDecoderAdapter(fused, encoder_output)
    expected = plain.forward(ids, plain.new_cache(1), 5)
    assert torch.allclose(joined.forward(ids, joined.new_cache(1), 5), expected, atol=1e-4, rtol=1e-4)
