"""The direct causal-LM pass (`decoding/causal_lm.py`): transformers' logits bit for bit, and when it applies.

Its logits must equal transformers' own forward exactly (fp32, `torch.equal`) for a prefill, single steps, a
verification pass after a crop, and a ragged batch with holes; anything it cannot mirror goes through
`CausalLMAdapter` (transformers' forward), which keeps its own exactness checks here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from decoding import (
    AssistantDraft,
    CausalLMAdapter,
    GenerationOptions,
    causal_lm_adapter,
    generate,
)
from decoding.causal_lm import GPT2Pass, LlamaPass, direct_pass_unsupported
from decoding.engine import generate_batch
from decoding.kernels.products import reference_kernels
from decoding.ragged import RaggedBatch

VOCAB = 97


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(arch: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """Random two-layer fp32 models of each supported shape (grouped-query attention where it exists)."""
    torch.manual_seed(seed)
    llama = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
             "initializer_range": 0.3, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if arch == "gpt2-layer-scaled":
        return tiny("gpt2", seed, scale_attn_by_inverse_layer_idx=True, **overrides)
    if arch == "gpt2":
        config = GPT2Config(**{"vocab_size": VOCAB, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
                               "initializer_range": 0.3, "bos_token_id": None, "eos_token_id": None,
                               "pad_token_id": None, **overrides})
        return GPT2LMHeadModel(config).eval()
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**{**llama, **overrides})).eval()
    if arch == "llama-mha":
        return LlamaForCausalLM(LlamaConfig(**{**llama, "num_key_value_heads": 4, **overrides})).eval()
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(**{**llama, "sliding_window": None, **overrides})).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**{**llama, "use_sliding_window": False, **overrides})).eval()
    raise ValueError(arch)


ARCHS = ("gpt2", "gpt2-layer-scaled", "llama", "llama-mha", "mistral", "qwen2")


@pytest.mark.parametrize("arch", ARCHS)
def test_direct_pass_is_chosen(arch: str) -> None:
    adapter = causal_lm_adapter(tiny(arch))
    assert isinstance(adapter, GPT2Pass if arch.startswith("gpt2") else LlamaPass)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernels", ("reference", "default"))
def test_logits_equal_transformers(arch: str, kernels: str) -> None:
    """With PyTorch's kernels on both sides, the same bits; with ours (oneDNN on a CPU), the same to 1e-5."""
    same = torch.equal if kernels == "reference" else (lambda a, b: torch.allclose(a, b, atol=1e-5, rtol=1e-5))
    with reference_kernels(kernels == "reference"):
        _check_against_transformers(arch, same)


def _check_against_transformers(arch: str, same) -> None:
    for seed in range(4):
        lm = tiny(arch, seed)
        ours, theirs = causal_lm_adapter(lm), CausalLMAdapter(lm)
        ours_cache, their_cache = ours.new_cache(1), theirs.new_cache(1)
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (1, 20), generator=g)
        # Prefill, two steps, a 4-token verification pass, a crop into it, another verification pass, steps.
        for chunk, keep in ((ids[:, :7], None), (ids[:, 7:8], None), (ids[:, 8:9], None), (ids[:, 9:13], 10),
                            (ids[:, 13:18], None), (ids[:, 18:19], None), (ids[:, 19:20], None)):
            width = chunk.shape[1]
            expected = theirs.forward(chunk, their_cache, width)
            assert same(ours.forward(chunk, ours_cache, width), expected), f"seed {seed} width {width}"
            if keep is not None:
                ours.crop(ours_cache, keep)
                theirs.crop(their_cache, keep)
        assert ours_cache.length == their_cache.get_seq_length() == 17
        assert ours.forward(ids[:, :1], ours.new_cache(1), 0).shape == (1, 0, VOCAB)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("arch", ("gpt2", "llama", "qwen2"))
@reference_kernels()
def test_half_precision_logits_equal_transformers(arch: str, dtype: torch.dtype) -> None:
    lm = tiny(arch, 3).to(dtype)
    ours, theirs = causal_lm_adapter(lm), CausalLMAdapter(lm)
    ours_cache, their_cache = ours.new_cache(1), theirs.new_cache(1)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    for chunk in (ids[:, :6], ids[:, 6:7], ids[:, 7:11]):
        width = chunk.shape[1]
        assert torch.equal(ours.forward(chunk, ours_cache, width), theirs.forward(chunk, their_cache, width))


@pytest.mark.parametrize("arch", ("gpt2", "llama"))
def test_ragged_batch_equals_transformers(arch: str) -> None:
    """Rows of different lengths with holes (rewound drafts): explicit masks and positions, and row selection."""
    lm = tiny(arch, 5)
    ours, theirs = RaggedBatch(causal_lm_adapter(lm), 3), RaggedBatch(CausalLMAdapter(lm), 3)
    g = torch.Generator().manual_seed(5)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    steps = [[tokens(3), tokens(6), tokens(1)], [tokens(4), tokens(1), tokens(2)], [tokens(1), [], tokens(5)],
             [tokens(2), tokens(3), tokens(1)]]
    rewinds = [{0: 5, 2: 2}, {1: 6}, {}, {}]
    for inputs, rewind in zip(steps, rewinds):
        width = max(len(r) for r in inputs)
        assert torch.equal(ours.feed(inputs, width), theirs.feed(inputs, width))
        for row, length in rewind.items():
            ours.rewind(row, length)
            theirs.rewind(row, length)
    assert ours.holes
    ours.select([2, 0])
    theirs.select([2, 0])
    inputs = [tokens(2), tokens(3)]
    assert torch.equal(ours.feed(inputs, 3), theirs.feed(inputs, 3))


@pytest.mark.parametrize("arch", ("gpt2", "llama"))
def test_batched_assisted_generation_equals_single_rows(arch: str) -> None:
    lm, assistant = tiny(arch, 1), tiny(arch, 2)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 4, 9, 2)]
    options = GenerationOptions(max_new_tokens=10, num_assistant_tokens=3)
    # Rows leave the batch at different times: row 2 with an end-of-sequence token it emits early.
    single = [generate(causal_lm_adapter(lm), p, options).tokens for p in prompts]
    eos = single[2][3]
    options = GenerationOptions(max_new_tokens=10, num_assistant_tokens=3, eos_token_ids=(eos,))
    expected = [generate(causal_lm_adapter(lm), p, options).tokens for p in prompts]
    for draft in (None, AssistantDraft(causal_lm_adapter(assistant)), AssistantDraft(causal_lm_adapter(lm))):
        results = generate_batch(causal_lm_adapter(lm), prompts, options, draft=draft)
        assert [r.tokens for r in results] == expected


@pytest.mark.parametrize("arch", ("gpt2", "llama"))
def test_transformers_forward_adapter_stays_exact(arch: str) -> None:
    """`CausalLMAdapter`, the path for every other architecture: assisted greedy == plain greedy."""
    for seed in range(6):
        lm, assistant = tiny(arch, seed), tiny(arch, 100 + seed)
        prompt = torch.randint(0, VOCAB, (1 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = generate(CausalLMAdapter(lm), prompt, GenerationOptions(max_new_tokens=12))
        assert plain.tokens == generate(causal_lm_adapter(lm), prompt, GenerationOptions(max_new_tokens=12)).tokens
        for other in (lm, assistant):
            result = generate(CausalLMAdapter(lm), prompt, GenerationOptions(max_new_tokens=12),
                              draft=AssistantDraft(CausalLMAdapter(other)))
            assert result.tokens == plain.tokens


@pytest.mark.parametrize("make, reason", [
    (lambda: tiny("gpt2", attn_implementation="eager"), "attention implementation 'eager'"),
    (lambda: tiny("mistral", sliding_window=8), "sliding"),
    (lambda: tiny("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0), "sliding"),
    (lambda: OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                      num_attention_heads=2, word_embed_proj_dim=16)).eval(), "OPTForCausalLM"),
], ids=["eager", "mistral-window", "qwen2-window", "opt"])
def test_other_models_use_transformers_forward(make, reason: str) -> None:
    lm = make()
    assert reason in (direct_pass_unsupported(lm) or "")
    adapter = causal_lm_adapter(lm)
    assert type(adapter) is CausalLMAdapter
    prompt = [3, 1, 4, 1, 5]
    plain = generate(adapter, prompt, GenerationOptions(max_new_tokens=8))
    assisted = generate(adapter, prompt, GenerationOptions(max_new_tokens=8), draft=AssistantDraft(adapter))
    assert plain.tokens == assisted.tokens and assisted.stats.acceptance_rate == 1.0
