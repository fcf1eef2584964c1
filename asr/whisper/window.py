"""One 30 s window: the encoder pass, decoding with openai-whisper's temperature fallback, and the cut into
timestamped segments."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from asr.results import Segment
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.logit_rules import screen_exact_ids
from audio.constants import HOP_LENGTH, SAMPLE_RATE
from decoding import (
    DraftSource,
    GenerationOptions,
    GenerationStats,
    LogitsFilter,
    SamplingOptions,
)
from decoding.beam import BeamOptions, beam_search_batch, rank
from decoding.engine import GenerationResult, generate_batch

if TYPE_CHECKING:
    from asr.models.tokenizer import SpecialTokens


# Windows per encoder pass on a CPU (see `encode`).
CPU_ENCODER_ROWS = 8


@torch.inference_mode()
def encode(model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """Runs the encoder on `[batch, n_mels, 3000]` log-mel features; returns `[batch, 1500, d_model]`.

    On a CPU at most `CPU_ENCODER_ROWS` windows a pass: the encoder is compute-bound there, and 16 windows in one
    pass took 0.67 s each against 0.58 s in passes of 8 (`base`, 2 cores; its attention outgrows the caches)."""
    param = next(model.parameters())
    features = features.to(device=param.device, dtype=param.dtype)
    encoder = model.get_encoder()
    rows = CPU_ENCODER_ROWS if param.device.type == "cpu" else len(features)
    parts = [encoder(features[i:i + rows]).last_hidden_state for i in range(0, len(features), max(rows, 1))]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class WindowContext:
    """What an assistant needs to know about the window being decoded."""

    features: torch.Tensor  # [1, n_mels, 3000] log-mel features of the window
    encoder_output: torch.Tensor  # [1, 1500, d_model] the model's encoder output
    prompt: list[int]  # the model's decoder prompt
    filters: list[LogitsFilter]  # the model's logit rules for this prompt
    previous: list[int]  # previous-text tokens in the prompt (model ids)
    language: str
    task: str
    timestamps: bool
    # The prompt's last tokens, which the output is forced to start with (<|0.00|> and a prefix), model ids.
    forced: list[int] = field(default_factory=list)


@dataclass
class WindowResult:
    """The accepted decoding of one window (openai-whisper's DecodingResult)."""

    # Generated tokens, end-of-text excluded (timestamps included).
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


@dataclass(frozen=True)
class FallbackRules:
    """When a window is decoded again at a higher temperature."""

    temperatures: tuple[float, ...]
    compression_ratio_threshold: float | None
    logprob_threshold: float | None
    no_speech_threshold: float | None

    def needs_fallback(self, result: WindowResult) -> bool:
        """openai-whisper's checks: too repetitive or too unsure, unless the window is silence."""
        too_repetitive = (self.compression_ratio_threshold is not None
                          and result.compression_ratio > self.compression_ratio_threshold)
        too_unsure = self.logprob_threshold is not None and result.avg_logprob < self.logprob_threshold
        silent = (self.no_speech_threshold is not None and result.no_speech_prob > self.no_speech_threshold
                  and too_unsure)
        return (too_repetitive or too_unsure) and not silent


def compression_ratio(text: str) -> float:
    """Bytes of the text over bytes of its zlib compression: high for repetitive text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class WindowSettings:
    """What stays the same for every window of one run."""

    rules: FallbackRules  # temperatures and thresholds
    special: SpecialTokens  # end of text, no speech, timestamps
    decode_text: Callable[[list[int]], str]  # tokens -> text, for the compression check and segments
    max_new_tokens: int  # most tokens in one window
    schedule: str  # drafting schedule
    num_assistant_tokens: int  # drafts per round (start)
    # openai-whisper's search: beam search at temperature 0 when beam_size > 1 (the model alone), best_of
    # samples per window at higher temperatures, the best of either by sum log-probability over the length
    # (or over the length penalty `((5 + length) / 6) ** length_penalty`).
    beam_size: int = 1
    patience: float | None = None
    length_penalty: float | None = None
    best_of: int = 1


def decode_windows(
    decoder: WhisperDecoderAdapter,
    prompts: Sequence[Sequence[int]],
    filters: Sequence[Sequence[LogitsFilter]],
    settings: WindowSettings,
    *,
    make_draft: Callable[[list[int]], DraftSource] | None,
    sot_from_end: int,
    seed: int | None,
) -> list[tuple[WindowResult, GenerationStats]]:
    """Decodes a batch of windows, each at every temperature in turn until its result passes the checks.

    Rows that fail a check are decoded again together at the next temperature; the others are done. At
    temperature 0 with `settings.beam_size` > 1 a window is beam searched (without drafts); at a higher
    temperature `settings.best_of` samples of each window are decoded together (as rows of one batch, each with
    drafts) and the best is kept (openai-whisper's `decode_with_fallback`).

    Args:
        decoder: the model's decoder over the windows (their cross-attention keys and values computed once).
        prompts: per window, previous-text tokens and the start-of-transcript sequence.
        filters: per window, Whisper's logit rules for its prompt.
        settings: the run's fallback rules, special tokens and drafting options.
        make_draft: rows -> the assistant's draft source for those windows (it reuses its encoder output
            across temperatures), or None.
        sot_from_end: how far <|startoftranscript|> is from the end of every prompt (a negative index); the
            no-speech probability is read there.
        seed: seed for sampled attempts.

    Returns:
        Per window: the last attempt (the first that passed, or the one at the highest temperature) and the
        statistics of all its attempts.
    """
    results: list[WindowResult | None] = [None] * len(prompts)
    stats = [GenerationStats() for _ in prompts]
    pending = list(range(len(prompts)))
    for temperature in settings.rules.temperatures:
        options = GenerationOptions(
            max_new_tokens=settings.max_new_tokens,
            eos_token_ids=(settings.special.eot,),
            max_length=decoder.max_length,
            sampling=SamplingOptions(temperature=temperature),
            seed=seed,
            schedule=settings.schedule,
            num_assistant_tokens=settings.num_assistant_tokens,
            prompt_logits_at=sot_from_end,
        )
        if temperature == 0 and settings.beam_size > 1:
            beam = BeamOptions(settings.beam_size, settings.patience)
            found = beam_search_batch(decoder.rows(pending), [prompts[i] for i in pending], options, beam,
                                      [filters[i] for i in pending])
            for i, result in zip(pending, found):
                stats[i].add(result.stats)
                best = result.best(settings.length_penalty)
                results[i] = _window_result(best.tokens, best.sum_logprob, result.prompt_logits, temperature,
                                            settings)
        else:
            copies = settings.best_of if temperature > 0 else 1
            rows = [i for i in pending for _ in range(copies)]
            draft = make_draft(rows) if make_draft is not None else None
            generated = generate_batch(_greedy_head(decoder.rows(rows), [filters[i] for i in rows], temperature,
                                                    settings.special),
                                       [prompts[i] for i in rows], options, draft, [filters[i] for i in rows])
            for n, i in enumerate(pending):
                samples = generated[n * copies:(n + 1) * copies]
                chosen = _best_sample(samples, settings.length_penalty)
                for sample in samples:
                    if sample is not samples[0]:
                        sample.stats.total_seconds = 0.0  # one call's time, counted once
                    stats[i].add(sample.stats)
                results[i] = _window_result(_text_tokens(chosen), sum(chosen.logprobs), chosen.prompt_logits,
                                            temperature, settings)
        pending = [i for i in pending if settings.rules.needs_fallback(results[i])]
        if not pending:
            break
    return [(r, s) for r, s in zip(results, stats)]


def _greedy_head(decoder: WhisperDecoderAdapter, filters: list[list[LogitsFilter]], temperature: float,
                 special: SpecialTokens) -> WhisperDecoderAdapter:
    """At temperature 0, the decoder with its float32 head screened (`decoding.kernels.screened_head`: float32's argmax
    for less of the head's memory traffic); sampling reads every probability, so it keeps the full head."""
    if temperature > 0:
        return decoder
    exact: set[int] = set()
    for row in filters:
        ids = screen_exact_ids(row, special, decoder.vocab_size)
        if ids is None:
            return decoder
        exact.update(ids)
    return decoder.screened(sorted(exact))


def _text_tokens(generated: GenerationResult) -> list[int]:
    return generated.tokens[:-1] if generated.finished else generated.tokens


def _best_sample(samples: list[GenerationResult], length_penalty: float | None) -> GenerationResult:
    """openai-whisper's ranking of a window's samples (`decoding.beam.rank`); the first of equals."""
    if len(samples) == 1:
        return samples[0]
    return samples[rank([len(_text_tokens(s)) for s in samples], [sum(s.logprobs) for s in samples],
                        length_penalty)]


def _window_result(tokens: list[int], sum_logprob: float, prompt_logits: torch.Tensor | None, temperature: float,
                   settings: WindowSettings) -> WindowResult:
    """The window's result from its chosen candidate: tokens (end-of-text excluded) and their summed
    log-probability (end-of-text's included when it ended the sequence)."""
    # openai-whisper divides by the token count plus one: the end-of-text token's log-probability is included.
    avg_logprob = sum_logprob / (len(tokens) + 1)
    no_speech_prob = 0.0
    if prompt_logits is not None:
        no_speech_prob = prompt_logits.float().softmax(-1)[settings.special.no_speech].item()
    text = settings.decode_text([t for t in tokens if t < settings.special.eot])
    return WindowResult(tokens, temperature, avg_logprob, compression_ratio(text), no_speech_prob)


def no_speech_skip(result: WindowResult, rules: FallbackRules) -> bool:
    """openai-whisper skips a window as silence when no-speech is likely and the text is unsure."""
    if rules.no_speech_threshold is None or result.no_speech_prob <= rules.no_speech_threshold:
        return False
    return not (rules.logprob_threshold is not None and result.avg_logprob > rules.logprob_threshold)


# Whisper's timestamps are 0.02 s apart: two mel frames per encoder position.
TIME_PRECISION = 0.02
INPUT_STRIDE = 2


def split_segments(result: WindowResult, special: SpecialTokens, seek: int, segment_size: int,
                   decode_text: Callable[[list[int]], str]) -> tuple[list[Segment], int]:
    """openai-whisper's segmentation of one window's tokens at consecutive timestamp pairs (every segment, the
    instantaneous and the empty ones too: `kept_segments` leaves them out once words have been aligned).

    Args:
        result: the window's decoding.
        special: the model's special tokens (end of text, timestamps).
        seek: the window's first mel frame in the audio.
        segment_size: the window's length in mel frames.
        decode_text: tokens -> text.

    Returns:
        (the window's segments, how many mel frames to advance).
    """
    timestamp_begin, eot = special.timestamp_begin, special.eot
    time_offset = seek * HOP_LENGTH / SAMPLE_RATE
    segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
    tokens = result.tokens
    is_timestamp = [t >= timestamp_begin for t in tokens]
    single_timestamp_ending = is_timestamp[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]

    def make(start: float, end: float, seg_tokens: list[int]) -> Segment:
        text = decode_text([t for t in seg_tokens if t < eot])
        return Segment(0, seek, round(start, 3), round(end, 3), text, seg_tokens, result.temperature,
                       result.avg_logprob, result.compression_ratio, result.no_speech_prob)

    segments: list[Segment] = []
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
        last = 0
        for current in slices:
            piece = tokens[last:current]
            start = time_offset + (piece[0] - timestamp_begin) * TIME_PRECISION
            end = time_offset + (piece[-1] - timestamp_begin) * TIME_PRECISION
            segments.append(make(start, end, piece))
            last = current
        if single_timestamp_ending:
            advance = segment_size
        else:
            # The window ended inside speech: resume at the last complete segment's end.
            advance = (tokens[last - 1] - timestamp_begin) * INPUT_STRIDE or segment_size
    else:
        duration = segment_duration
        timestamps = [t for t in tokens if t >= timestamp_begin]
        if timestamps and timestamps[-1] != timestamp_begin:
            duration = (timestamps[-1] - timestamp_begin) * TIME_PRECISION
        segments.append(make(time_offset, time_offset + duration, tokens))
        advance = segment_size
    return segments, advance


def ends_on_single_timestamp(tokens: list[int], timestamp_begin: int) -> bool:
    """Whether a window's tokens end on a lone timestamp (its text ran to the window's end)."""
    return len(tokens) >= 2 and tokens[-2] < timestamp_begin <= tokens[-1]


def kept_segments(segments: list[Segment], window_end: float) -> list[Segment]:
    """The segments that carry words (openai-whisper clears instantaneous segments and those without text, after
    word alignment has fitted their times), with times inside the window's audio: the model may place a
    timestamp past the audio's end in the last window, which openai-whisper lets run past it."""
    kept = []
    for segment in segments:
        if segment.start == segment.end or not segment.text.strip():
            continue
        segment.start, segment.end = min(segment.start, window_end), min(segment.end, window_end)
        for word in segment.words or ():
            word.start, word.end = min(word.start, window_end), min(word.end, window_end)
        kept.append(segment)
    return kept
