"""The word-timestamp pass over the decoder adapter's own cross-attention keys and values gives what transformers'
eager decoder gives over the encoder output (the pass it replaced)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.models.registry import load_model
from asr.whisper.decoder import WhisperDecoderAdapter
from decoding.kernels.products import onednn_only, reference_kernels


def _eager(model: torch.nn.Module, ids: torch.Tensor, encoder_output: torch.Tensor,
           heads: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model.get_decoder()(input_ids=ids, encoder_hidden_states=encoder_output, output_attentions=True,
                                      use_cache=False)
            logits = model.get_output_embeddings()(out.last_hidden_state)[0].float()
    finally:
        model.set_attn_implementation(previous)
    return logits, torch.stack([out.cross_attentions[layer][0, head] for layer, head in heads]).float()


@pytest.mark.parametrize("kernels", ["default", "onednn", "reference"])
def test_alignment_pass_matches_the_eager_decoder(tiny_whisper_folder: Path, kernels: str) -> None:
    bundle = load_model(str(tiny_whisper_folder))
    config = bundle.model.config
    generator = torch.Generator().manual_seed(3)
    encoder_output = torch.randn(1, config.max_source_positions, config.d_model, generator=generator)
    tokens = bundle.special.prompt([], "en", "transcribe", False)[0] + \
        torch.randint(0, 50000, (40,), generator=generator).tolist() + [bundle.special.eot]
    ids = torch.tensor([tokens])
    # Heads out of order, two in one layer: the weights come back in the order asked.
    heads = [(config.decoder_layers - 1, 1), (0, 2), (config.decoder_layers - 1, 0)]
    switch = {"default": reference_kernels(False), "onednn": onednn_only(), "reference": reference_kernels()}[kernels]
    with switch:
        logits, weights = WhisperDecoderAdapter(bundle.model, encoder_output).alignment_pass(ids, heads)
    expected_logits, expected_weights = _eager(bundle.model, ids, encoder_output, heads)
    assert weights.shape == (len(heads), len(tokens), config.max_source_positions)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), expected_logits.argmax(-1))
