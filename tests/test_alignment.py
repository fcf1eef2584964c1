"""The word-timestamp pass over the decoder adapter's own cross-attention keys and values gives what transformers'
eager decoder gives over the encoder output (the pass it replaced), and the compiled median filter and time
warping what transformers' loops give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.models.whisper.generation_whisper import _dynamic_time_warping, _median_filter

from asr.models.registry import load_model
from asr.whisper.alignment import transformers_alignment_pass
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper import alignment_kernels
from asr.whisper.alignment_kernels import dynamic_time_warping, median_filter
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


@pytest.fixture(params=["compiled", "loops"])
def kernels(request, monkeypatch) -> str:
    """The compiled loops, or (as for a short clip's window before they are loaded) transformers' and numpy's."""
    monkeypatch.setattr(alignment_kernels, "_compiled_for", lambda cells: request.param == "compiled")
    return request.param


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (3, 40), (40, 3), (25, 300), (86, 1500)])
@pytest.mark.parametrize("values", ["normal", "ties"])
def test_compiled_time_warping_takes_transformers_path(shape: tuple[int, int], values: str, kernels: str) -> None:
    # transformers' loop is openai-whisper's; small integers make cost ties, where the order of the choice shows.
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    matrix = rng.normal(size=shape) if values == "normal" else rng.integers(-2, 3, size=shape).astype(np.float64)
    text, time = dynamic_time_warping(matrix)
    expected_text, expected_time = _dynamic_time_warping(matrix)
    assert text.tolist() == expected_text.tolist() and time.tolist() == expected_time.tolist()


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (5,), (2, 3, 4)])
def test_time_warping_of_an_empty_or_misshapen_matrix_says_so(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="at least one token and one frame"):
        dynamic_time_warping(np.zeros(shape))


@pytest.mark.parametrize("shape", [(9,), (3, 9), (1, 2, 3, 9)])
def test_median_filter_of_a_misshapen_array_says_so(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="takes a 3-dimensional array"):
        median_filter(np.zeros(shape, dtype=np.float32), 7)


@pytest.mark.parametrize("width", [7, 5])
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 1, 7), (6, 30, 700), (2, 5, 3)])
@pytest.mark.parametrize("values", ["normal", "zeros and ones", "ties", "nan"])
def test_compiled_median_filter_gives_transformers_medians(shape: tuple[int, int, int], values: str, width: int,
                                                            kernels: str) -> None:
    # Zeros and ones over 700 frames hold every pattern of 7 (the zero-one principle: a network that sorts them
    # sorts anything); torch sorts NaN last.
    rng = np.random.default_rng(sum(shape))
    x = {"normal": lambda: rng.normal(size=shape), "zeros and ones": lambda: rng.integers(0, 2, size=shape),
         "ties": lambda: rng.integers(-2, 3, size=shape), "nan": lambda: rng.normal(size=shape)}[values]()
    x = x.astype(np.float32)
    if values == "nan":
        x[rng.random(shape) < 0.1] = np.nan
    expected = _median_filter(torch.from_numpy(x.copy()), width).numpy()
    np.testing.assert_array_equal(median_filter(x, width), expected)


def test_median_filter_refuses_an_even_width() -> None:
    with pytest.raises(ValueError, match="odd number"):
        median_filter(np.zeros((1, 1, 9), dtype=np.float32), 4)


def test_a_short_window_keeps_the_loops_until_the_compiled_ones_are_loaded() -> None:
    small, large = alignment_kernels.COMPILED_FROM_CELLS - 1, alignment_kernels.COMPILED_FROM_CELLS
    assert alignment_kernels._compiled_for(large)
    assert alignment_kernels._compiled_for(small) == alignment_kernels.loaded()
    alignment_kernels.load()
    assert alignment_kernels.loaded() and alignment_kernels._compiled_for(small)
