"""The word-timestamp pass over the decoder adapter's own cross-attention keys and values gives what transformers'
eager decoder gives over the encoder output (the pass it replaced)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.models.registry import load_model
from asr.whisper.alignment import transformers_alignment_pass
from asr.whisper.decoder import WhisperDecoderAdapter
from decoding.kernels.products import onednn_only, reference_kernels


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
    expected_logits, expected_weights = transformers_alignment_pass(bundle.model, ids, encoder_output, heads)
    assert weights.shape == (len(heads), len(tokens), config.max_source_positions)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), expected_logits.argmax(-1))
