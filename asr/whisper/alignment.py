"""Word-level timestamps: cross-attention of the alignment heads, aligned with dynamic time warping.

After openai-whisper's `timing.py`: one forward pass of the model's decoder over a window's final text tokens,
over the cross-attention keys and values that decoding projected (projecting the encoder output again cost more
than the pass), so the word times depend only on the model's output, never on how it was decoded (with or without
an assistant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from asr.results import Segment, Word
from asr.whisper.alignment_kernels import dynamic_time_warping, median_filter

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.whisper.decoder import WhisperDecoderAdapter

# Encoder positions per second (each covers two 10 ms mel frames).
TOKENS_PER_SECOND = 50
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_ENDS = ".。!！?？"


@dataclass
class _Timing:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def transformers_alignment_pass(model: torch.nn.Module, input_ids: torch.Tensor, encoder_output: torch.Tensor,
                                heads: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """What `WhisperDecoderAdapter.alignment_pass` gives, from transformers' eager decoder over the encoder output
    (the pass word timestamps took before it; tests and scripts/bench_alignment.py compare the two)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model.get_decoder()(input_ids=input_ids, encoder_hidden_states=encoder_output,
                                      output_attentions=True, use_cache=False)
            logits = model.get_output_embeddings()(out.last_hidden_state)[0].float()
    finally:
        model.set_attn_implementation(previous)
    return logits, torch.stack([out.cross_attentions[layer][0, head] for layer, head in heads]).float()


@torch.inference_mode()
def _align(decoder: WhisperDecoderAdapter, tokenizer, start_sequence: list[int], text_tokens: list[int], eot: int,
           num_frames: int, alignment_heads: Sequence[tuple[int, int]], language: str) -> list[_Timing]:
    from transformers.models.whisper.tokenization_whisper import (
        _split_tokens_on_spaces,
        _split_tokens_on_unicode,
    )

    tokens = start_sequence + text_tokens + [eot]
    logits, weights = decoder.alignment_pass(torch.tensor([tokens], device=decoder.device), alignment_heads)
    text_probs = logits[len(start_sequence) - 1: -2, :eot].softmax(-1)
    token_probs = text_probs[torch.arange(len(text_tokens)), torch.tensor(text_tokens)].tolist()

    # Cross-attention of the alignment heads over the frames that hold audio, renormalised there (the same as
    # openai-whisper's softmax over those frames), standardised per head, median-filtered, averaged.
    weights = weights[:, :, : max(num_frames // 2, 1)]
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = torch.from_numpy(median_filter(((weights - mean) / std.clamp_min(1e-12)).cpu().numpy(),
                                             MEDIAN_FILTER_WIDTH))
    matrix = weights.mean(0)[len(start_sequence) - 1: -1]  # the <|notimestamps|> row starts the first word
    text_indices, time_indices = dynamic_time_warping(-matrix.double().cpu().numpy())

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
    """Attaches opening punctuation to the next word and closing punctuation to the previous one (openai-whisper's
    `merge_punctuations`: a run of marks joins the same word)."""
    following = len(timings) - 1
    for i in range(len(timings) - 2, -1, -1):
        current = timings[i]
        if current.word.startswith(" ") and current.word.strip() in PREPEND_PUNCTUATIONS:
            timings[following].word = current.word + timings[following].word
            timings[following].tokens = current.tokens + timings[following].tokens
            current.word, current.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(timings)):
        current = timings[j]
        if not timings[previous].word.endswith(" ") and current.word in APPEND_PUNCTUATIONS:
            timings[previous].word += current.word
            timings[previous].tokens += current.tokens
            current.word, current.tokens = "", []
        else:
            previous = j
    return timings


def add_word_timestamps(segments: list[Segment], bundle: WhisperBundle, decoder: WhisperDecoderAdapter,
                        start_sequence: list[int], num_frames: int, time_offset: float, language: str,
                        last_speech_timestamp: float = 0.0) -> None:
    """Fills `segment.words` for one window's segments and fits each segment's times to its words, by
    openai-whisper's rules (`timing.add_word_timestamps`): words at sentence ends, and the first words after a
    pause, are cut to twice the median word duration; a segment keeps its own start (end) where its first (last)
    word runs more than 0.5 s past it.

    Args:
        segments: the window's segments (their tokens include timestamps; only text tokens are aligned).
        bundle: the loaded model (its tokenizer, end-of-text id and alignment heads: the (layer, head) pairs that
            follow the audio).
        decoder: the model's decoder over the window (its cross-attention keys and values, as decoding used them).
        start_sequence: the start-of-transcript sequence followed by <|notimestamps|>.
        num_frames: mel frames of real audio in the window.
        time_offset: start of the window in seconds.
        language: decides how text splits into words.
        last_speech_timestamp: the end of the last word before this window (seconds): a first word long after
            it follows a pause.
    """
    eot = bundle.special.eot
    per_segment = [[t for t in segment.tokens if t < eot] for segment in segments]
    text_tokens = [t for tokens in per_segment for t in tokens]
    if not text_tokens:
        for segment in segments:
            segment.words = []
        return
    timings = _align(decoder, bundle.tokenizer, start_sequence, text_tokens, eot, num_frames, bundle.alignment_heads,
                     language)
    durations = np.array([t.end - t.start for t in timings])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):  # a word at a sentence's end (or just after one) lasts at most twice the median
        for previous, timing in zip(timings, timings[1:]):
            if timing.end - timing.start > longest:
                if timing.word in SENTENCE_ENDS:
                    timing.end = timing.start + longest
                elif previous.word in SENTENCE_ENDS:
                    timing.start = timing.end - longest
    timings = _merge_punctuations(timings)
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
        if words:
            _fit(segment, words, median, longest, last_speech_timestamp)
            last_speech_timestamp = segment.end
        segment.words = words


def _fit(segment: Segment, words: list[Word], median: float, longest: float, last_speech: float) -> None:
    """openai-whisper's fit of a segment and its first and last words to each other."""
    first = words[0]
    # The first and second words after a pause last at most twice the median.
    if first.end - last_speech > median * 4 and (
            first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - longest)
    # The segment's own start where the first word is too long; else the first word's.
    if segment.start < first.end and segment.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, segment.start))
    else:
        segment.start = first.start
    last = words[-1]
    if segment.end > last.start and segment.end + 0.5 < last.end:
        last.end = max(last.start + median, segment.end)
    else:
        segment.end = last.end
