"""Word-level timestamps: cross-attention of the alignment heads, aligned with dynamic time warping.

After openai-whisper's `timing.py`: one forward pass of the model over a window's final text tokens, so the
word times depend only on the model's output, never on how it was decoded (with or without an assistant).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import torch

from asr.results import Segment, Word

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

# Encoder positions per second (each covers two 10 ms mel frames).
TOKENS_PER_SECOND = 50
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"


@dataclass
class _Timing:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


@contextmanager
def _eager_attention(model: torch.nn.Module) -> Iterator[None]:
    """Attention weights are only returned by the eager implementation; restore the fast one afterwards."""
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)


@torch.inference_mode()
def _align(model: torch.nn.Module, tokenizer, encoder_output: torch.Tensor, start_sequence: list[int],
           text_tokens: list[int], eot: int, num_frames: int, alignment_heads: Sequence[tuple[int, int]],
           language: str) -> list[_Timing]:
    from transformers.models.whisper.generation_whisper import (
        _dynamic_time_warping,
        _median_filter,
    )
    from transformers.models.whisper.tokenization_whisper import (
        _split_tokens_on_spaces,
        _split_tokens_on_unicode,
    )

    tokens = start_sequence + text_tokens + [eot]
    ids = torch.tensor([tokens], device=encoder_output.device)
    with _eager_attention(model):
        out = model.get_decoder()(input_ids=ids, encoder_hidden_states=encoder_output, output_attentions=True,
                                  use_cache=False)
    logits = model.get_output_embeddings()(out.last_hidden_state)[0].float()
    text_probs = logits[len(start_sequence) - 1: -2, :eot].softmax(-1)
    token_probs = text_probs[torch.arange(len(text_tokens)), torch.tensor(text_tokens)].tolist()

    # Cross-attention of the alignment heads over the frames that hold audio, renormalised there (the same as
    # openai-whisper's softmax over those frames), standardised per head, median-filtered, averaged.
    weights = torch.stack([out.cross_attentions[layer][0, head] for layer, head in alignment_heads]).float()
    weights = weights[:, :, : max(num_frames // 2, 1)]
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = _median_filter((weights - mean) / std.clamp_min(1e-12), MEDIAN_FILTER_WIDTH)
    matrix = weights.mean(0)[len(start_sequence) - 1: -1]  # the <|notimestamps|> row starts the first word
    text_indices, time_indices = _dynamic_time_warping(-matrix.double().cpu().numpy())

    split = _split_tokens_on_unicode if language in {"zh", "ja", "th", "lo", "my", "yue"} else _split_tokens_on_spaces
    words, word_tokens, _ = split(tokenizer, text_tokens + [eot])
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    timings = []
    for word, toks, i, j in zip(words[:-1], word_tokens[:-1], boundaries[:-1], boundaries[1:]):
        timings.append(_Timing(word, toks, float(jump_times[i]), float(jump_times[j]),
                               float(np.mean(token_probs[i:j])) if j > i else 0.0))
    return timings


def _merge_punctuations(timings: list[_Timing]) -> list[_Timing]:
    """Attaches opening punctuation to the next word and closing punctuation to the previous one."""
    for i in range(len(timings) - 2, -1, -1):
        current, following = timings[i], timings[i + 1]
        if current.word.startswith(" ") and current.word.strip() in PREPEND_PUNCTUATIONS and following.word:
            following.word = current.word + following.word
            following.tokens = current.tokens + following.tokens
            current.word, current.tokens = "", []
    for i in range(1, len(timings)):
        previous, current = timings[i - 1], timings[i]
        if previous.word and not previous.word.endswith(" ") and current.word in APPEND_PUNCTUATIONS and current.word:
            previous.word += current.word
            previous.tokens += current.tokens
            current.word, current.tokens = "", []
    return timings


def add_word_timestamps(segments: list[Segment], bundle: WhisperBundle, encoder_output: torch.Tensor,
                        start_sequence: list[int], num_frames: int, time_offset: float, language: str) -> None:
    """Fills `segment.words` for one window's segments and fits each segment's times to its words.

    Args:
        segments: the window's segments (their tokens include timestamps; only text tokens are aligned).
        bundle: the loaded model (its decoder and cross-attention run once more with eager attention; its
            tokenizer, end-of-text id and alignment heads: the (layer, head) pairs that follow the audio).
        encoder_output: `[1, 1500, d]` the window's encoder output.
        start_sequence: the start-of-transcript sequence followed by <|notimestamps|>.
        num_frames: mel frames of real audio in the window.
        time_offset: start of the window in seconds.
        language: decides how text splits into words.
    """
    eot = bundle.special.eot
    per_segment = [[t for t in segment.tokens if t < eot] for segment in segments]
    text_tokens = [t for tokens in per_segment for t in tokens]
    if not text_tokens:
        for segment in segments:
            segment.words = []
        return
    timings = _merge_punctuations(_align(bundle.model, bundle.tokenizer, encoder_output, start_sequence, text_tokens,
                                         eot, num_frames, bundle.alignment_heads, language))
    index = 0
    for segment, tokens in zip(segments, per_segment):
        consumed, words = 0, []
        while index < len(timings) and consumed < len(tokens):
            timing = timings[index]
            if timing.word:
                words.append(Word(timing.word, round(time_offset + timing.start, 2), round(time_offset + timing.end, 2),
                                  round(timing.probability, 4)))
            consumed += len(timing.tokens)
            index += 1
        # Keep words inside their segment, then fit the segment to its words (openai-whisper does the same).
        for word in words:
            word.start = min(max(word.start, segment.start), segment.end)
            word.end = min(max(word.end, word.start), segment.end)
        if words:
            segment.start, segment.end = words[0].start, max(words[-1].end, words[0].start)
        segment.words = words
