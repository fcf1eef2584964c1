"""Speculative sampling keeps the model's exact distribution (chi-square against softmax(logits / T) with
top-k / top-p), and seeded sampling is reproducible. Models and helpers: tests/test_engine.py."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import GPT2Config, GPT2LMHeadModel

from decoding import (
    AssistantDraft,
    GenerationOptions,
    GenerationResult,
    PromptLookupDraft,
    SamplingOptions,
    causal_lm_adapter,
    generate,
)
from tests.test_engine import (
    ARCHS,
    KINDS,
    NEW_TOKENS,
    SEEDS,
    Recorder,
    check_stats,
    draft_for,
    model,
    prompt_for,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class TableLM:
    """A tiny model for fast sampling statistics: the next-token logits are a fixed random function of the last
    two tokens. It follows the adapter protocol exactly (the cache is the token list)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.vocab_size = table.shape[-1]
        self.device = torch.device("cpu")

    @classmethod
    def random(cls, vocab: int, seed: int, scale: float = 1.5) -> TableLM:
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(vocab, vocab, vocab, generator=g) * scale)

    def noisy(self, seed: int, scale: float) -> TableLM:
        g = torch.Generator().manual_seed(seed)
        return TableLM(self.table + torch.randn(self.table.shape, generator=g) * scale)

    def logits_after(self, context: Sequence[int]) -> torch.Tensor:
        before = context[-2] if len(context) > 1 else 0
        return self.table[before, context[-1]]

    def new_cache(self, batch_size: int = 1) -> list[int]:
        assert batch_size == 1
        return []

    def forward(self, input_ids: torch.Tensor, cache: list[int], num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        # One row without holes: the mask and positions are the plain causal ones.
        assert input_ids.shape[0] == 1 and attention_mask is None
        cache.extend(input_ids[0].tolist())
        rows = [self.logits_after(cache[: len(cache) - num_logits + j + 1]) for j in range(num_logits)]
        if not rows:
            return torch.empty(1, 0, self.vocab_size)
        return torch.stack(rows)[None].clone()

    def crop(self, cache: list[int], length: int) -> None:
        del cache[length:]

    def select(self, cache: list[int], rows: torch.Tensor) -> None:
        assert rows.tolist() == [0]


def reference_probs(logits: torch.Tensor, sampling: SamplingOptions) -> np.ndarray:
    """softmax(logits / T) with top-k, then top-p, written out independently of `decoding.filters`."""
    z = logits.double().numpy() / sampling.temperature
    keep = np.ones_like(z, dtype=bool)
    if sampling.top_k is not None:
        keep &= z >= np.sort(z)[::-1][sampling.top_k - 1]
    z = np.where(keep, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if sampling.top_p is not None:
        order = np.argsort(-p)
        kept, total = [], 0.0
        for i in order:  # smallest prefix of the sorted distribution that reaches top_p
            kept.append(i)
            total += p[i]
            if total >= sampling.top_p:
                break
        mask = np.zeros_like(p, dtype=bool)
        mask[kept] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def assert_distribution(samples: Sequence[int], expected: np.ndarray, what: str, min_samples: int = 300) -> None:
    """Tokens of zero probability never occur; the rest pass a chi-square test (bins under 5 expected merged)."""
    counts = np.bincount(np.asarray(samples, dtype=np.int64), minlength=len(expected)).astype(float)
    n = counts.sum()
    assert n >= min_samples, f"{what}: only {n:.0f} samples"
    impossible = expected == 0
    assert counts[impossible].sum() == 0, f"{what}: sampled zero-probability tokens {np.nonzero(counts * impossible)}"
    exp = expected[~impossible] * n
    obs = counts[~impossible]
    small = exp < 5
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
    if len(exp) < 2:
        return
    p_value = chisquare(obs, exp).pvalue
    assert p_value > 1e-3, f"{what}: chi-square p = {p_value:.2g}; observed {obs}, expected {np.round(exp, 1)}"


def sample_runs(lm, draft_factory, prompt: list[int], sampling: SamplingOptions, runs: int, k: int = 2,
                max_new_tokens: int = 3) -> list[tuple[GenerationResult, Recorder]]:
    out = []
    for run in range(runs):
        options = GenerationOptions(max_new_tokens=max_new_tokens, sampling=sampling, schedule="constant",
                                    num_assistant_tokens=k, seed=1_000 + run)
        recorder = Recorder(draft_factory())
        out.append((generate(lm, prompt, options, draft=recorder), recorder))
    return out


def next_token_logits(lm, context: list[int]) -> torch.Tensor:
    return lm.forward(torch.tensor([context]), lm.new_cache(), 1)[0, -1]


def check_sampling(lm, draft_factory, prompt: list[int], sampling: SamplingOptions, runs: int,
                   min_samples: int = 300) -> None:
    """First token ~ p(. | prompt); second token, when the first was an accepted draft, ~ p(. | prompt, first).

    With k = 2 and three new tokens, the second token then comes from the same round: the second draft kept, or
    the residual distribution after its rejection.
    """
    results = sample_runs(lm, draft_factory, prompt, sampling, runs)
    for result, _ in results:
        check_stats(result, prompt)
    assert_distribution([r.tokens[0] for r, _ in results], reference_probs(next_token_logits(lm, prompt), sampling),
                        "first token", min_samples)
    accepted = [(r, rec.first_round_accepted(r.tokens)) for r, rec in results]
    assert {n for _, n in accepted} == {0, 1, 2}, "every acceptance branch should occur"
    after_accept = [r.tokens for r, n in accepted if n >= 1]
    x = Counter(t[0] for t in after_accept).most_common(1)[0][0]
    second = [t[1] for t in after_accept if t[0] == x]
    assert_distribution(second, reference_probs(next_token_logits(lm, prompt + [x]), sampling),
                        f"second token after accepted {x}", min_samples)


VOCAB_SMALL = 12
SAMPLING_CASES = {
    "T=1": SamplingOptions(temperature=1.0),
    "T=0.7 top_k=4": SamplingOptions(temperature=0.7, top_k=4),
    "T=1.3 top_p=0.8": SamplingOptions(temperature=1.3, top_p=0.8),
    "top_k=6 top_p=0.9": SamplingOptions(temperature=1.0, top_k=6, top_p=0.9),
}


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_speculative_sampling_keeps_model_distribution(case: str) -> None:
    lm = TableLM.random(VOCAB_SMALL, seed=1)
    assistant = lm.noisy(seed=2, scale=1.5)
    check_sampling(lm, lambda: AssistantDraft(assistant), [3, 7, 1], SAMPLING_CASES[case], runs=2000)


def test_speculative_sampling_with_deterministic_drafts() -> None:
    """Prompt lookup proposes tokens with q = one-hot: accepted with probability p(x)."""
    lm = TableLM.random(VOCAB_SMALL, seed=3)
    sampling = SamplingOptions(temperature=1.0, top_p=0.95)
    prompt = [4, 5, 6, 4, 5, 6, 4, 5]
    results = sample_runs(lm, PromptLookupDraft, prompt, sampling, runs=2000, max_new_tokens=2)
    assert all(rec.proposals[0] == [6] for _, rec in results)  # "4 5" was followed by 6
    assert_distribution([r.tokens[0] for r, _ in results], reference_probs(next_token_logits(lm, prompt), sampling),
                        "first token")


def test_speculative_sampling_on_a_transformers_model() -> None:
    """The same property through a real model and its croppable cache (fewer runs: slower per step)."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB_SMALL, n_positions=16, n_embd=16, n_layer=1, n_head=2, initializer_range=1.0,
                        bos_token_id=None, eos_token_id=None)
    net = GPT2LMHeadModel(config).eval()
    noisy = copy.deepcopy(net)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    check_sampling(causal_lm_adapter(net), lambda: AssistantDraft(causal_lm_adapter(noisy)), [3, 7, 1],
                   SamplingOptions(temperature=1.0, top_k=8), runs=500, min_samples=80)


@pytest.mark.parametrize("arch", ARCHS)
def test_identical_assistant_accepts_everything_when_sampling(arch: str) -> None:
    for seed in SEEDS[:5]:
        lm = model(arch, seed)
        prompt = prompt_for(seed)
        options = GenerationOptions(max_new_tokens=NEW_TOKENS, sampling=SamplingOptions(temperature=0.9, top_p=0.95),
                                    seed=seed)
        result = generate(causal_lm_adapter(lm), prompt, options, draft=AssistantDraft(causal_lm_adapter(lm)))
        assert result.stats.acceptance_rate >= 0.99 and len(result.tokens) == NEW_TOKENS
        check_stats(result, prompt)


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_sampling_is_reproducible(kind: str) -> None:
    arch, seed = "llama", 3
    lm = model(arch, seed)
    prompt = prompt_for(seed)

    def run(s: int) -> list[int]:
        options = GenerationOptions(max_new_tokens=NEW_TOKENS, seed=s,
                                    sampling=SamplingOptions(temperature=0.8, top_k=50, top_p=0.9))
        return generate(causal_lm_adapter(lm), prompt, options, draft=draft_for(kind, arch, seed)).tokens

    tokens = [run(s) for s in (5, 5, 6, 7)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2] or tokens[0] != tokens[3]
