"""The screened float32 head (`decoding.kernels.screened_head`): float32's argmax under Whisper's rules, float32's
logits where they are named, and the same words as the full head on tiny random models and on real speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decoding.kernels import native
from decoding.kernels.products import WidenedLinear, full_head, native_bfloat16, reference_kernels
from decoding.kernels.screened_head import _INT8_ROWS, HeadScreen, screened_head

pytestmark = pytest.mark.skipif(not native_bfloat16(), reason="the screen needs a CPU with native bfloat16")

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _head(seed: int, vocab: int = 3000, width: int = 64) -> torch.nn.Linear:
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(width, vocab, bias=False)
    with torch.no_grad():
        # Rows of different sizes, as a trained embedding's are.
        scale = torch.rand(vocab, 1, generator=generator) + 0.2
        head.weight.copy_(torch.randn(vocab, width, generator=generator) * scale * width ** -0.5)
    return head


def _rows(seed: int, count: int, width: int = 64, size: float = 8.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(1, count, width, generator=generator) * size


def _case(seed: int, vocab: int) -> tuple[torch.Generator, list[int], torch.Tensor]:
    """A seed's generator, the ids named exact (every special from 2500 on and 40 others) and 1-7 rows of h."""
    generator = torch.Generator().manual_seed(seed)
    exact_ids = sorted(set(range(2500, vocab)) | set(torch.randint(0, 2500, (40,), generator=generator).tolist()))
    return generator, exact_ids, _rows(seed, count=1 + seed % 7, size=float(1 + seed % 20))


@pytest.mark.parametrize("seed", range(40))
def test_the_argmax_is_float32s_whatever_the_rules_mask(seed: int) -> None:
    head = _head(seed)
    vocab = head.weight.shape[0]
    generator, exact_ids, x = _case(seed, vocab)
    with torch.inference_mode():
        expected = x @ head.weight.T
        got = screened_head(head, exact_ids)(x)
    assert got.shape == expected.shape
    # The named ids are float32's, the others within a bfloat16 rounding of it.
    torch.testing.assert_close(got[..., exact_ids], expected[..., exact_ids], rtol=1e-5, atol=1e-5)
    screen = screened_head(head, exact_ids).screen
    if x.shape[1] <= _INT8_ROWS and native.library() is not None:  # the int8 screen's bound, row by row
        bound = x.norm(dim=-1, keepdim=True) * screen.quantized[2]
    else:  # the bfloat16 screen's
        weight_norm, low_norm, rounding_norm = screen.norms
        low = x.bfloat16().float()
        bound = ((x - low).norm(dim=-1, keepdim=True) * weight_norm
                 + low.norm(dim=-1, keepdim=True) * (rounding_norm + screen.gamma * low_norm))
        bound = bound + 2.0 ** -8 * (1 + 2.0 ** -7) * got.abs()
    assert ((got - expected).abs() <= bound + 1e-5).all()
    ids = torch.tensor(exact_ids)
    for trial in range(6):
        masked_exact = ids[torch.rand(len(ids), generator=generator) < 0.5]
        mask_free = trial % 3 == 2  # the timestamp rule masks every text id at once
        ours, theirs = got.clone(), expected.clone()
        for logits in (ours, theirs):
            logits[..., masked_exact] = -torch.inf
            if mask_free:
                free = torch.ones(vocab, dtype=torch.bool)
                free[ids] = False
                logits[..., free] = -torch.inf
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
        # The largest unnamed logit is float32's too (the timestamp rule compares against it).
        if not mask_free:
            free = torch.ones(vocab, dtype=torch.bool)
            free[ids] = False
            torch.testing.assert_close(ours[..., free].max(-1).values, theirs[..., free].max(-1).values,
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gap", [1e-2, 1e-3, 1e-4])
def test_near_ties_bfloat16_cannot_tell_apart_are_decided_in_float32(gap: float) -> None:
    head = _head(7)
    x = _rows(7, count=3)
    with torch.no_grad():
        # Row 10 well above every other logit of the first query, and row 11 above it by `gap`: the same in
        # bfloat16, ordered in float32.
        direction = x[0, 0] / x[0, 0].norm() ** 2
        head.weight[10] = head.weight[10] + 50 * direction
        head.weight[11] = head.weight[10] + gap * direction
    with torch.inference_mode():
        expected = x @ head.weight.T
        got = screened_head(head, [])(x)
    assert expected[0, 0].argmax() == 11
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_no_positions_give_no_logits() -> None:
    """A pass that only fills the cache asks for no logits (an English-only model's prompt ends in its start
    token): tiny.en with a prompt crashed here (issue 38, case 1)."""
    head = _head(0)
    with torch.inference_mode():
        got = screened_head(head, [2500])(torch.zeros(2, 0, 64))
    assert got.shape == (2, 0, 3000) and got.dtype == torch.float32


def test_the_screen_is_made_once_per_head_and_again_for_new_weights() -> None:
    head = _head(3)
    first = screened_head(head, [1, 2])
    assert screened_head(head, [2, 1]) is first
    assert screened_head(head, [1]).screen is first.screen
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    assert screened_head(head, [1, 2]).screen is not first.screen
    assert isinstance(first.screen, HeadScreen)


def test_no_screen_where_it_does_not_apply() -> None:
    head = _head(3)
    with reference_kernels():
        assert screened_head(head, []) is None
    with full_head():
        assert screened_head(head, []) is None
    assert screened_head(head.to(torch.bfloat16), []) is None
    biased = torch.nn.Linear(64, 100)
    assert screened_head(biased, []) is None


def test_whisper_rules_name_their_single_ids_and_everything_from_end_of_text() -> None:
    from types import SimpleNamespace

    from asr.whisper.logit_rules import screen_exact_ids, whisper_filters
    from decoding.filters import SuppressTokens

    # base's ids: end-of-text 50257, <|notimestamps|> 50363, timestamps from 50364 in a vocabulary of 51865.
    special = SimpleNamespace(suppress_tokens=(1, 2, 50358), begin_suppress_tokens=(220, 50257), eot=50257,
                              no_timestamps=50363, timestamp_begin=50364)
    filters = whisper_filters(special, sample_begin=4, timestamps=True, suppress_tokens=[5, 7])
    ids = screen_exact_ids(filters, special, 51865)
    assert set(ids) == set(range(50257, 51865)) | {5, 7, 220}
    assert set(screen_exact_ids(whisper_filters(special, 4, timestamps=False), special, 51865)) == (
        set(range(50257, 51865)) | {1, 2, 220})

    class Other:
        def apply(self, tokens, logits):
            return logits

    assert screen_exact_ids([*filters, Other()], special, 51865) is None
    assert screen_exact_ids([SuppressTokens([3])], special, 51865) == [3, *range(50257, 51865)]


def _transcribe(bundle, audio, assistant=None, **options):
    from asr.transcription import transcribe
    from asr.options import TranscribeOptions

    return transcribe(bundle, audio, TranscribeOptions(**options), assistant)


@pytest.mark.parametrize("seed", [3, 5, 8, 13])
def test_tiny_random_whisper_says_the_same_tokens_with_the_screen(tmp_path: Path, seed: int) -> None:
    from asr.assist.choose import make_assistant
    from asr.models.registry import load_model
    from audio.load import load_audio
    from tests.conftest import tiny_whisper_in

    bundle = load_model(str(tiny_whisper_in(tmp_path / "model", seed)))
    audio = load_audio(str(sorted(SAMPLES.glob("*.flac"))[0]))
    with full_head():
        expected = _transcribe(bundle, audio, temperatures=(0.0,))
    got = _transcribe(bundle, audio, temperatures=(0.0,))
    assert [s.tokens for s in got.segments] == [s.tokens for s in expected.segments]
    assisted = _transcribe(bundle, audio, temperatures=(0.0,), assistant=make_assistant("self:int8", bundle))
    assert [s.tokens for s in assisted.segments] == [s.tokens for s in expected.segments]


def test_base_says_the_same_words_on_real_speech_with_the_screen(base) -> None:
    from audio.load import load_audio
    from tests.conftest import evaldata

    audio = load_audio(str(evaldata("longform", "p002.mp3")))
    with full_head():
        expected = _transcribe(base, audio)
    got = _transcribe(base, audio)
    assert [s.tokens for s in got.segments] == [s.tokens for s in expected.segments]
    for ours, theirs in zip(got.segments, expected.segments):
        assert abs(ours.avg_logprob - theirs.avg_logprob) < 1e-2


def _widened_head(seed: int) -> WidenedLinear:
    return WidenedLinear(_head(seed).weight.detach().to(torch.bfloat16))


@pytest.mark.skipif(native.library() is None, reason="WidenedLinear needs decoding.kernels.native")
@pytest.mark.parametrize("seed", range(12))
def test_a_widened_heads_screen_gives_its_argmax_and_its_named_logits(seed: int) -> None:
    """The int8 model's head (bfloat16 weights, float32 products) screened: the argmax of the product over its
    widened weights, whatever the rules mask, and the named ids' logits those of its own product."""
    head = _widened_head(seed)
    vocab = head.weight.shape[0]
    generator, exact_ids, x = _case(seed, vocab)
    with torch.inference_mode():
        expected = x @ head.weight.float().T
        got = screened_head(head, exact_ids)(x)
        own = head(x)
    torch.testing.assert_close(got[..., exact_ids], own[..., exact_ids], rtol=1e-5, atol=1e-5)
    ids = torch.tensor(exact_ids)
    for trial in range(6):
        masked_exact = ids[torch.rand(len(ids), generator=generator) < 0.5]
        ours, theirs = got.clone(), expected.clone()
        for logits in (ours, theirs):
            logits[..., masked_exact] = -torch.inf
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.skipif(native.library() is None, reason="WidenedLinear needs decoding.kernels.native")
def test_a_widened_linear_is_the_float32_product_of_its_widened_weights_row_by_row() -> None:
    head = _widened_head(3)
    widened = head.weight.float()
    x = _rows(3, count=9)[0]
    with torch.inference_mode():
        alone = torch.cat([head(x[i:i + 1]) for i in range(len(x))])
        together = head(x)
        # Each row's bits whatever the rows beside it, and a float32 weight's product's bits.
        assert torch.equal(alone, together)
        assert torch.equal(together, native.rowdot(x, widened))
        many = head(x.repeat(40, 1))  # past decoding's rows: oneDNN's bfloat16 product
    assert (many[:9] - together).abs().max() < 2e-2 * together.abs().max()  # bfloat16 rows and results
    with pytest.raises(ValueError, match="bfloat16 weights"):
        WidenedLinear(widened)
