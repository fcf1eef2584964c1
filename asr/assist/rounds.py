"""How many tokens a draft model proposes a round, chosen from step costs measured on this machine.

A round of k drafts costs k draft steps and one model pass over k + 1 tokens (the check), and yields the agreeing
prefix plus the model's own next token: (1 - a^(k+1)) / (1 - a) tokens on average for a per-token acceptance a
(Leviathan et al. 2023). Against plain decoding, a token per one-token step, a round's speed-up is

    (1 - a^(k+1)) / (1 - a) * step(1) / (k * draft(1) + step(k + 1))

the cost model of docs/design.md with the check's measured cost in place of a one-token step's (with
step(k + 1) = step(1) and draft(1) = c * step(1) it is that formula). Whether a check of a few tokens costs about
a step (oneDNN's products, a GPU) or noticeably more (the row-by-row native kernels, whose time grows with the
rows) is what moves the best k between 3 and 1, so rather than guessing it from the kernels in use
`measured_rounds` times the pair when a draft model is paired with its model: after a warm-up, the fastest of
`REPEATS` interleaved passes of the model (screened head, as greedy decoding runs it) over 1 to `MAX_ROUND` + 1
tokens and of the draft over one token, over a window of noise after `CONTEXT` tokens (the speed does not depend
on what the audio says): some 40 passes, about half a second for `base` on a 2-core CPU. The fastest, not the
median: this runs once, at load, where another process may hold the cores for part of it, and waiting only ever
adds time, so the fastest run is the closest to a pass's own cost. `best_rounds` then
takes the constant k with the most tokens a second at the draft's acceptance (the agreement it reached on its
held-out recordings, else `DRAFT_ACCEPTANCE`; the shortest of those within `TOLERANCE`), and the speed-up that k
expects decides whether `--assistant auto` drafts at all (`asr.assist.choose.AUTO_MIN_SPEEDUP`). The choice is
kept per (model, draft) and logged at INFO; `--schedule` and `--num-assistant-tokens` override it
(`TranscribeOptions.drafting`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.logit_rules import screen_exact_ids, whisper_filters

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

logger = logging.getLogger(__name__)

# Per-token acceptance assumed for a draft model whose report has no held-out agreement: the first `base-draft:int8`
# kept 66 % and 73 % of its drafts in rounds of one on long-form and on the 65 English recordings (docs/drafts.md).
DRAFT_ACCEPTANCE = 0.7
# The longest constant round considered.
MAX_ROUND = 5
# Timed passes of each kind after the warm-up; the fastest is kept.
REPEATS = 5
# Rounds expected within this fraction of the best one's speed count as equal, and the shortest of them is taken:
# it wastes the fewest draft steps where the acceptance is lower than `DRAFT_ACCEPTANCE`.
TOLERANCE = 0.02
# Text tokens decoded before the timed passes: a step part-way into a window.
CONTEXT = list(range(400, 432))


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one pass of each kind, as measured (`measure_costs`) or given (tests)."""

    model: tuple[float, ...]  # the model's pass over n tokens at [n - 1]: a step, then checks of 1, 2, ... drafts
    draft: float  # the draft's one-token step


def expected_speedup(costs: StepCosts, k: int, acceptance: float) -> float:
    """Tokens a second of constant rounds of `k` drafts over plain decoding's (see the module's docstring)."""
    tokens = k + 1 if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return tokens * costs.model[0] / (k * costs.draft + costs.model[k])


def best_rounds(costs: StepCosts, acceptance: float = DRAFT_ACCEPTANCE) -> tuple[str, int]:
    """The constant schedule `(constant, k)` with the most expected tokens a second, for k from 1 to the widest
    check measured less one; of rounds within `TOLERANCE` of the best, the shortest.

    Raises:
        ValueError: no check was measured (`costs.model` holds fewer than 2 passes).
    """
    if len(costs.model) < 2:
        raise ValueError("step costs need the model's pass over at least 2 tokens")
    speedups = {k: expected_speedup(costs, k, acceptance) for k in range(1, len(costs.model))}
    best = max(speedups.values())
    return "constant", min(k for k, speedup in speedups.items() if speedup >= best * (1 - TOLERANCE))


@torch.inference_mode()
def measure_costs(model_bundle: WhisperBundle, draft_model: torch.nn.Module, draft_dtype: torch.dtype | None = None,
                  max_round: int = MAX_ROUND) -> StepCosts:
    """Times `model_bundle`'s decoder (its head screened as greedy decoding screens it) over 1 to `max_round` + 1
    new tokens and `draft_model` (read as a drafting copy, over the encoder output in `draft_dtype`) over one."""
    model = model_bundle.model
    parameter = next(model.parameters())
    config = model.config
    encoder_output = torch.randn(1, config.max_source_positions, config.d_model,
                                 generator=torch.Generator().manual_seed(0)).to(parameter.device)
    special = model_bundle.special
    prompt = special.prompt([], "en", "transcribe", True)[0]
    decoder = WhisperDecoderAdapter(model, encoder_output)
    exact = screen_exact_ids(whisper_filters(special, len(prompt), timestamps=True), special, decoder.vocab_size)
    if exact is not None:
        decoder = decoder.screened(exact)
    draft = WhisperDecoderAdapter(draft_model, encoder_output.to(draft_dtype or encoder_output.dtype),
                                  drafting=True)
    context = torch.tensor([prompt + CONTEXT], device=parameter.device)
    passes = _passes(decoder, context, range(1, max_round + 2)) + _passes(draft, context, [1])
    sync = torch.cuda.synchronize if parameter.device.type == "cuda" else (lambda: None)
    # Two warm-up rounds on a GPU: a graph's capture and its first replay are checked against the layers.
    for _ in range(2 if parameter.device.type == "cuda" else 1):
        for run in passes:
            run()
    times: list[list[float]] = [[] for _ in passes]
    for _ in range(REPEATS):  # interleaved, so that a machine slowing down slows every kind alike
        for run, seconds in zip(passes, times):
            sync()
            start = time.perf_counter()
            run()
            sync()
            seconds.append(time.perf_counter() - start)
    fastest = [min(t) for t in times]
    return StepCosts(model=tuple(fastest[:-1]), draft=fastest[-1])


def _passes(decoder: WhisperDecoderAdapter, context: torch.Tensor, widths: Iterable[int]) -> list[Callable[[], None]]:
    """Per width, one pass of that many new tokens after `context`, over one cache cut back after each call."""
    cache = decoder.new_cache(1)
    decoder.forward(context, cache, 1)
    length = cache.length

    def one(width: int) -> Callable[[], None]:
        ids = context[:, -width:]

        def run() -> None:
            decoder.forward(ids, cache, width)
            decoder.crop(cache, length)

        return run

    return [one(width) for width in widths]


# (model, draft) -> the schedule measured for them; weak, so a pair's entry goes with either module.
_CHOSEN: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()


def measured_rounds(model_bundle: WhisperBundle, draft_model: torch.nn.Module, draft_dtype: torch.dtype | None = None,
                    acceptance: float = DRAFT_ACCEPTANCE) -> tuple[tuple[str, int], float]:
    """The schedule a draft model drafts with for `model_bundle`'s model, `best_rounds` over the costs measured
    for the pair (`measure_costs`) at the draft's `acceptance`, and the speed-up over plain decoding it expects;
    measured once per (model, draft)."""
    model = model_bundle.model
    chosen = _CHOSEN.setdefault(model, weakref.WeakKeyDictionary()).get(draft_model)
    if chosen is None:
        costs = measure_costs(model_bundle, draft_model, draft_dtype)
        schedule = best_rounds(costs, acceptance)
        chosen = schedule, expected_speedup(costs, schedule[1], acceptance)
        _CHOSEN[model][draft_model] = chosen
        logger.info("draft rounds: model pass %s ms over 1..%d tokens, draft step %.2f ms; at acceptance %.2f "
                    "constant rounds of %d (%.2fx plain decoding expected)",
                    ", ".join(f"{1000 * s:.2f}" for s in costs.model), len(costs.model), 1000 * costs.draft,
                    acceptance, schedule[1], chosen[1])
    return chosen
