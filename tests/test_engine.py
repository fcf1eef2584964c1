"""The assisted-generation engine (`decoding/`): greedy exactness, limits, statistics, errors.

The central property (design.md §9, house-style "Tests"): assisted greedy output is the model's own greedy output
token for token, and equals transformers' `generate(do_sample=False)`, whatever the draft source: the model
itself, an unrelated model, perturbed copies, prompt lookup, and an assistant with another tokenizer
(tests/test_universal.py). Sampling keeps the model's exact distribution: tests/test_sampling.py.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence

import pytest
import torch
from transformers import (
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

from decoding import (
    AssistantDraft,
    CausalLMAdapter,
    GenerationOptions,
    GenerationResult,
    PromptLookupDraft,
    SamplingOptions,
    causal_lm_adapter,
    generate,
)

VOCAB = 200
NEW_TOKENS = 12
SEEDS = range(16)
PROMPT_LENGTHS = (1, 2, 5, 11)
ARCHS = ("gpt2", "llama")
SCHEDULES = ("heuristic", "constant", "confidence")
KINDS = ("identical", "unrelated", "perturbed", "lookup")
# Relative weight noise of the perturbed copies (of each tensor's standard deviation): agrees part of the time.
NOISE = 0.05


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------------
# Tiny random models and references


def tiny_causal_lm(arch: str, seed: int, vocab: int = VOCAB, **overrides) -> torch.nn.Module:
    """A random two-layer fp32 causal LM, GPT-2- or Llama-shaped, with no end-of-sequence token."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        # A wide initialisation makes random GPT-2s less repetitive.
        kwargs = {"vocab_size": vocab, "n_positions": 128, "n_embd": 32, "n_layer": 2, "n_head": 2,
                  "initializer_range": 0.6, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
        config = GPT2Config(**{**kwargs, **overrides})
        return GPT2LMHeadModel(config).eval()
    kwargs = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
              "initializer_range": 0.3, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    return LlamaForCausalLM(LlamaConfig(**{**kwargs, **overrides})).eval()


@functools.cache
def model(arch: str, seed: int) -> torch.nn.Module:
    return tiny_causal_lm(arch, seed)


@functools.cache
def unrelated(arch: str, seed: int) -> torch.nn.Module:
    return tiny_causal_lm(arch, 10_000 + seed)


@functools.cache
def perturbed(arch: str, seed: int) -> torch.nn.Module:
    copy_ = copy.deepcopy(model(arch, seed))
    g = torch.Generator().manual_seed(20_000 + seed)
    with torch.no_grad():
        for p in copy_.parameters():
            scale = p.std() if p.numel() > 1 else p.abs()
            p.add_(torch.randn(p.shape, generator=g) * scale * NOISE)
    return copy_


def prompt_for(seed: int, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(30_000 + seed)
    return torch.randint(0, vocab, (PROMPT_LENGTHS[seed % len(PROMPT_LENGTHS)],), generator=g).tolist()


def transformers_greedy(lm: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int,
                        eos: int | None = None, max_length: int | None = None) -> list[int]:
    """transformers' own greedy search; no length-limit or eos tricks unless asked."""
    config = GenerationConfig(do_sample=False, eos_token_id=eos, pad_token_id=0 if eos is None else eos,
                              bos_token_id=None, max_new_tokens=max_new_tokens)
    if max_length is not None:
        config.max_new_tokens = None
        config.max_length = max_length
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


@functools.cache
def reference(arch: str, seed: int) -> tuple[list[int], GenerationResult, list[int]]:
    """(prompt, our plain greedy result, transformers' greedy tokens) for one model and prompt."""
    prompt = prompt_for(seed)
    lm = model(arch, seed)
    plain = generate(causal_lm_adapter(lm), prompt, GenerationOptions(max_new_tokens=NEW_TOKENS))
    return prompt, plain, transformers_greedy(lm, prompt, NEW_TOKENS)


def draft_for(kind: str, arch: str, seed: int):
    if kind == "identical":
        return AssistantDraft(causal_lm_adapter(model(arch, seed)))
    if kind == "unrelated":
        return AssistantDraft(causal_lm_adapter(unrelated(arch, seed)))
    if kind == "perturbed":
        return AssistantDraft(causal_lm_adapter(perturbed(arch, seed)))
    return PromptLookupDraft()


def check_stats(result: GenerationResult, prompt: Sequence[int], drafted: bool = True) -> None:
    """Invariants every result's statistics keep."""
    s = result.stats
    assert s.generated_tokens == len(result.tokens) == len(result.logprobs)
    assert 0 <= s.accepted_tokens <= s.drafted_tokens
    assert s.model_forward_passes == s.rounds + (1 if len(prompt) > 1 else 0)
    rounds_with_drafts = sum(1 for k in s.draft_lengths if k > 0)
    assert sum(s.accepted_length_histogram.values()) == rounds_with_drafts
    assert sum(n * count for n, count in s.accepted_length_histogram.items()) == s.accepted_tokens
    assert sum(s.draft_lengths) == s.drafted_tokens
    # Each round adds its accepted drafts plus the model's token, except when an accepted draft was the eos.
    if result.finished:
        assert s.accepted_tokens + s.rounds - 1 <= s.generated_tokens <= s.accepted_tokens + s.rounds
    else:
        assert s.generated_tokens == s.accepted_tokens + s.rounds
    if not drafted:
        assert s.drafted_tokens == s.assistant_forward_passes == 0 and not s.accepted_length_histogram
    assert all(lp <= 1e-6 for lp in result.logprobs)


def distinct(tokens: Sequence[int]) -> int:
    return len(set(tokens))


class Recorder:
    """Wraps a draft source and keeps each round's proposal."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.proposals: list[list[int]] = []
        # (length of the sequence, max_tokens asked for, the proposal) per call.
        self.calls: list[tuple[int, int, list[int]]] = []

    def begin(self, *args, **kwargs) -> None:
        self.inner.begin(*args, **kwargs)

    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int], min_confidence: float | None):
        drafts = self.inner.propose(sequences, max_tokens, min_confidence)
        assert len(sequences) == len(drafts) == 1
        self.proposals.append(list(drafts[0].tokens))
        self.calls.append((len(sequences[0]), max_tokens[0], list(drafts[0].tokens)))
        return drafts

    def update(self, *args, **kwargs) -> None:
        self.inner.update(*args, **kwargs)

    def select(self, rows: Sequence[int]) -> None:
        self.inner.select(rows)

    def first_round_accepted(self, tokens: Sequence[int]) -> int:
        """Drafts kept in the first round: a rejected draft x has q(x) > p(x), so the residual never redraws x."""
        first = self.proposals[0] if self.proposals else []
        n = 0
        while n < len(first) and n < len(tokens) and first[n] == tokens[n]:
            n += 1
        return n


# ---------------------------------------------------------------------------------------------------------------
# The central property: assisted greedy == plain greedy == transformers' greedy


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_greedy_matches_transformers(arch: str) -> None:
    for seed in SEEDS:
        prompt, plain, hf = reference(arch, seed)
        assert plain.tokens == hf, f"{arch} seed {seed}"
        assert not plain.finished and len(plain.tokens) == NEW_TOKENS
        check_stats(plain, prompt, drafted=False)
        assert plain.stats.rounds == NEW_TOKENS


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_assisted_greedy_matches_greedy(arch: str, kind: str, schedule: str, k: int) -> None:
    options = GenerationOptions(max_new_tokens=NEW_TOKENS, schedule=schedule, num_assistant_tokens=k)
    # Half the seeds per case, the even ones for k = 1 and 5 and the odd ones for k = 3: every arch, kind and
    # schedule still meets every seed.
    seeds = SEEDS[(k // 2) % 2::2]
    rates = []
    for seed in seeds:
        prompt, plain, hf = reference(arch, seed)
        result = generate(causal_lm_adapter(model(arch, seed)), prompt, options, draft=draft_for(kind, arch, seed))
        assert result.tokens == hf, f"{kind} {schedule} k={k} seed {seed}"
        assert result.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
        assert not result.finished
        check_stats(result, prompt)
        assert all(n <= max(k, 1) or schedule == "heuristic" for n in result.stats.draft_lengths)
        if kind == "identical":
            assert result.stats.acceptance_rate == 1.0, f"seed {seed}"
            assert result.stats.drafted_tokens > 0
        if kind == "lookup":
            assert result.stats.assistant_forward_passes == 0
        if distinct(hf) >= NEW_TOKENS // 2 and result.stats.drafted_tokens:
            rates.append(result.stats.acceptance_rate)
    assert len(rates) >= len(seeds) // 4, "too few non-degenerate outputs to judge acceptance"
    mean = sum(rates) / len(rates)
    if kind == "unrelated":
        assert mean < 0.2, rates
    if kind == "perturbed":
        assert 0.2 < mean < 0.95, rates


# ---------------------------------------------------------------------------------------------------------------
# Limits: end of sequence, max_new_tokens and max_length in the middle of a round


def eos_case(arch: str, seed: int) -> tuple[list[int], list[int], int] | None:
    """(prompt, plain tokens up to and including eos, eos) with eos a token first emitted at position 2..7."""
    prompt, plain, _ = reference(arch, seed)
    for j in (3, 4, 2, 5, 6, 7):
        if plain.tokens[j] not in plain.tokens[:j]:
            return prompt, plain.tokens[: j + 1], plain.tokens[j]
    return None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_eos_drafted_mid_round(arch: str, kind: str) -> None:
    cases = mid_round = 0
    for seed in SEEDS[:8]:
        case = eos_case(arch, seed)
        if case is None:
            continue
        cases += 1
        prompt, expected, eos = case
        lm = model(arch, seed)
        if kind == "identical":
            assert transformers_greedy(lm, prompt, NEW_TOKENS, eos=eos) == expected
        for schedule in ("constant", "heuristic"):
            options = GenerationOptions(max_new_tokens=NEW_TOKENS, eos_token_ids=(eos,), schedule=schedule,
                                        num_assistant_tokens=5)
            plain = generate(causal_lm_adapter(lm), prompt, options)
            result = generate(causal_lm_adapter(lm), prompt, options, draft=draft_for(kind, arch, seed))
            for r in (plain, result):
                assert r.tokens == expected and r.finished, f"seed {seed}"
                check_stats(r, prompt, drafted=r is result)
            if kind == "identical":
                assert result.stats.acceptance_rate == 1.0
                if len(expected) <= 5:
                    # The first round drafts up to the eos (before k = 5 is reached), stops drafting there, and
                    # keeps the eos as an accepted draft.
                    assert result.stats.rounds == 1 and result.stats.drafted_tokens == len(expected)
                    assert result.stats.generated_tokens == result.stats.accepted_tokens
                    mid_round += 1
    assert cases >= 5
    assert kind != "identical" or mid_round >= 4


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
@pytest.mark.parametrize("arch", ARCHS)
def test_max_new_tokens_mid_round(arch: str, schedule: str) -> None:
    for seed in SEEDS[:3]:
        prompt, plain, _ = reference(arch, seed)
        lm = model(arch, seed)
        for n in range(1, 10):
            options = GenerationOptions(max_new_tokens=n, schedule=schedule, num_assistant_tokens=5)
            for assistant in (lm, unrelated(arch, seed)):
                recorder = Recorder(AssistantDraft(causal_lm_adapter(assistant)))
                result = generate(causal_lm_adapter(lm), prompt, options, draft=recorder)
                assert result.tokens == plain.tokens[:n] and not result.finished, f"seed {seed} n={n}"
                check_stats(result, prompt)
                # Never asks for more drafts than can be kept beside the model's own token.
                for length, max_tokens, proposal in recorder.calls:
                    assert 1 <= max_tokens <= len(prompt) + n - length - 1 and len(proposal) <= max_tokens
                if assistant is lm:
                    assert result.stats.acceptance_rate == (1.0 if n > 1 else 0.0)
                    assert result.stats.drafted_tokens == n - result.stats.rounds
                    if schedule == "constant":
                        assert result.stats.rounds == -(-n // 6)


def test_k_one_drafts_one_token_per_round() -> None:
    for seed in SEEDS[:8]:
        prompt, plain, _ = reference("gpt2", seed)
        options = GenerationOptions(max_new_tokens=NEW_TOKENS, schedule="constant", num_assistant_tokens=1)
        lm = model("gpt2", seed)
        result = generate(causal_lm_adapter(lm), prompt, options, draft=AssistantDraft(causal_lm_adapter(lm)))
        assert result.tokens == plain.tokens
        assert set(result.stats.draft_lengths) <= {0, 1}
        assert result.stats.rounds == NEW_TOKENS // 2 and result.stats.accepted_length_histogram == {1: NEW_TOKENS // 2}


@pytest.mark.parametrize("kind", ["identical", "unrelated", "lookup"])
@pytest.mark.parametrize("arch", ARCHS)
def test_max_length_respected_exactly(arch: str, kind: str) -> None:
    positions = 24
    limit = {"n_positions": positions} if arch == "gpt2" else {"max_position_embeddings": positions}
    lm = tiny_causal_lm(arch, 7, **limit)
    adapter = causal_lm_adapter(lm)
    assert adapter.max_length == positions
    other = tiny_causal_lm(arch, 8, **limit)
    draft = {"identical": lambda: AssistantDraft(causal_lm_adapter(lm)),
             "unrelated": lambda: AssistantDraft(causal_lm_adapter(other)),
             "lookup": PromptLookupDraft}[kind]
    for prompt_length in (1, 5, 23):
        g = torch.Generator().manual_seed(prompt_length)
        prompt = torch.randint(0, VOCAB, (prompt_length,), generator=g).tolist()
        expected = transformers_greedy(lm, prompt, None, max_length=positions)
        assert len(expected) == positions - prompt_length
        for schedule in ("constant", "heuristic"):
            options = GenerationOptions(max_new_tokens=100, max_length=positions, schedule=schedule,
                                        num_assistant_tokens=5)
            result = generate(adapter, prompt, options, draft=draft())
            assert result.tokens == expected and not result.finished
            assert len(prompt) + len(result.tokens) == positions
            check_stats(result, prompt)
        # A max_length below max_new_tokens + prompt cuts exactly; max_new_tokens below it wins.
        shorter = generate(adapter, prompt, GenerationOptions(max_new_tokens=100, max_length=prompt_length + 1),
                           draft=draft())
        assert shorter.tokens == expected[:1]
        fewer = generate(adapter, prompt, GenerationOptions(max_new_tokens=1, max_length=positions), draft=draft())
        assert fewer.tokens == expected[:1]
    with pytest.raises(ValueError, match="at most"):
        generate(adapter, [1] * positions, GenerationOptions(max_length=positions))


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        generate(causal_lm_adapter(model("gpt2", 0)), [], GenerationOptions())


@pytest.mark.parametrize("make", [
    lambda: SamplingOptions(temperature=-0.1),
    lambda: SamplingOptions(temperature=1.0, top_p=0.0),
    lambda: SamplingOptions(temperature=1.0, top_p=1.5),
    lambda: SamplingOptions(temperature=1.0, top_p=-0.2),
    lambda: SamplingOptions(temperature=1.0, top_k=0),
    lambda: GenerationOptions(schedule="fastest"),
    lambda: GenerationOptions(num_assistant_tokens=0),
    lambda: GenerationOptions(num_assistant_tokens=-3, schedule="constant"),
    lambda: GenerationOptions(max_new_tokens=0),
    lambda: GenerationOptions(schedule="confidence", confidence_threshold=1.5),
], ids=["temperature<0", "top_p=0", "top_p>1", "top_p<0", "top_k=0", "schedule", "k=0", "k<0", "max_new_tokens=0",
        "threshold"])
def test_invalid_options_raise(make) -> None:
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("make", [
    lambda: T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                                num_heads=2, decoder_start_token_id=0)),
    lambda: WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8,
        max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        decoder_start_token_id=2)),
], ids=["t5", "whisper"])
@pytest.mark.parametrize("adapter", [causal_lm_adapter, CausalLMAdapter])
def test_adapter_refuses_encoder_decoder(make, adapter) -> None:
    with pytest.raises(ValueError, match="encoder-decoder"):
        adapter(make())


@pytest.mark.parametrize("adapter", [causal_lm_adapter, CausalLMAdapter])
def test_adapter_refuses_model_without_lm_head(adapter) -> None:
    with pytest.raises(ValueError, match="head"):
        adapter(GPT2Model(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2)))
