"""A batch of token sequences of different lengths sharing one KV cache.

Each row's tokens sit in cache slots in order. When drafts are rejected, a row rewinds: with one row the
cache is simply cropped; with several, the rejected slots become holes that an explicit attention mask hides
(and trailing slots that no row uses any more are cropped). Rows may thus draft, accept and rewind by
different amounts in every round, which is what batched assisted decoding needs. A prompt enters the cache before
the first round (`prefill`), or with the first round's drafts where the model allows (`fused_prompt`).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.stats import GenerationStats


class RaggedBatch:
    """Sequences of one adapter, one cache, any lengths."""

    def __init__(self, adapter: ModelAdapter, batch_size: int) -> None:
        self.adapter = adapter
        self.cache: Any = adapter.new_cache(batch_size)
        self.slots: list[list[int]] = [[] for _ in range(batch_size)]  # cache slot of each token, per row
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=adapter.device)
        self.holes = False

    @property
    def batch_size(self) -> int:
        return len(self.slots)

    def length(self, row: int) -> int:
        """Tokens of `row` held in the cache."""
        return len(self.slots[row])

    def feed(self, inputs: Sequence[Sequence[int]], num_logits: int) -> torch.Tensor:
        """Appends each row's tokens and returns logits of the last `num_logits` input columns.

        Rows are left-padded to the longest, so column `-1` is every row's last token; a row with fewer tokens
        than `num_logits` has padding logits in its first columns (the caller ignores them).

        Args:
            inputs: token ids to append, per row (a row may have none).
            num_logits: how many of the last columns need logits.

        Returns:
            `[batch, num_logits, V]` float logits.
        """
        width = max(len(row) for row in inputs)
        device = self.adapter.device
        if width == 0:
            return torch.empty(self.batch_size, 0, self.adapter.vocab_size, device=device)
        start = self.valid.shape[1]
        new_valid = torch.zeros(self.batch_size, width, dtype=torch.bool)
        ids = torch.zeros(self.batch_size, width, dtype=torch.long)
        positions = torch.zeros(self.batch_size, width, dtype=torch.long)
        for b, row in enumerate(inputs):
            pad = width - len(row)
            if row:
                ids[b, pad:] = torch.tensor(list(row), dtype=torch.long)
                positions[b, pad:] = torch.arange(len(self.slots[b]), len(self.slots[b]) + len(row))
                new_valid[b, pad:] = True
                self.slots[b].extend(range(start + pad, start + width))
        if bool((~new_valid).any()):
            self.holes = True
        new_valid = new_valid.to(device)
        mask = None
        if self.holes:
            mask = self._mask(new_valid)
        max_position = getattr(self.adapter, "max_length", None)
        if max_position:
            positions.clamp_(max=max_position - 1)  # padding columns only; real positions are checked upstream
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        return self.adapter.forward(ids.to(device), self.cache, num_logits, attention_mask=mask,
                                    position_ids=positions.to(device) if self.holes else None)

    def _mask(self, new_valid: torch.Tensor) -> torch.Tensor:
        """`[batch, 1, T, S + T]` boolean: each token sees the valid earlier tokens of its own row, and itself."""
        width = new_valid.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=new_valid.device).tril()
        old = self.valid[:, None, :].expand(-1, width, -1)
        new = causal[None] & new_valid[:, None, :]
        new = new | torch.eye(width, dtype=torch.bool, device=new_valid.device)[None]
        return torch.cat([old, new], dim=2)[:, None]

    def rewind(self, row: int, length: int) -> None:
        """Keeps only the first `length` tokens of `row` in the cache."""
        dropped = self.slots[row][length:]
        if not dropped:
            return
        del self.slots[row][length:]
        if self.batch_size == 1 and not self.holes:
            self.adapter.crop(self.cache, length)
            self.valid = self.valid[:, :length]
            return
        self.valid[row, dropped] = False
        self.holes = True
        self._trim()

    def _trim(self) -> None:
        """Crops trailing slots that no row uses any more."""
        used = max((slots[-1] + 1 for slots in self.slots if slots), default=0)
        if used < self.valid.shape[1]:
            self.adapter.crop(self.cache, used)
            self.valid = self.valid[:, :used]
        if self.batch_size == 1 and bool(self.valid.all()):
            self.holes = False

    def select(self, rows: Sequence[int], same_state: bool = False) -> None:
        """Keeps only the given rows, in that order (finished sequences leave the batch); a row given twice is
        copied (beam search).

        `same_state`: each new row's per-row model state (Whisper: its window's encoder output) is that of the
        row now in its place, so only the cache moves (the adapter's `select_cache`, when it has one).
        """
        if list(rows) == list(range(self.batch_size)):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.adapter.device)
        select_cache = getattr(self.adapter, "select_cache", None)
        if same_state and select_cache is not None:
            select_cache(self.cache, index)
        else:
            self.adapter.select(self.cache, index)
        self.valid = self.valid[index]
        self.slots = [list(self.slots[r]) for r in rows]
        self._trim()


def fused_prompt(model: ModelAdapter, prompts: Sequence[Sequence[int]], drafts: Sequence[Sequence[int]]) -> bool:
    """Whether a lone prompt is fed whole with its first drafts in one pass: where the model says such a pass gives
    every token the numbers its steps would (`prompt_takes_steps(width)`), one pass fewer changes nothing."""
    takes = getattr(model, "prompt_takes_steps", None)
    return len(prompts) == 1 and takes is not None and bool(takes(len(prompts[0]) + len(drafts[0])))


def logits_back(prompt: Sequence[int], logits_at: int | None) -> int | None:
    """How many tokens before the prompt's last `logits_at` is (None: not asked for, or the last itself)."""
    if logits_at is None:
        return None
    at = logits_at if logits_at >= 0 else len(prompt) + logits_at
    if not 0 <= at < len(prompt):
        raise ValueError(f"prompt_logits_at={logits_at} is outside a prompt of {len(prompt)} tokens")
    return len(prompt) - 1 - at if at < len(prompt) - 1 else None


def prefill(batch: RaggedBatch, prompts: Sequence[Sequence[int]], logits_at: int | None,
            stats: Sequence[GenerationStats]) -> list[torch.Tensor | None]:
    """Feeds every prompt token but the last, in one pass, counting the pass in each prompt's `stats`.

    Returns:
        Per prompt, its logits at `logits_at` when this pass computes them; None when not asked for, or when
        that position is the prompt's last token (its logits come with the first step instead).

    Raises:
        ValueError: `logits_at` outside a prompt.
    """
    # How far each wanted position is from the end of its prompt's input (rows are left-padded, so the logits of
    # the last `num_logits` columns cover every row's wanted position).
    back = [logits_back(prompt, logits_at) for prompt in prompts]
    found: list[torch.Tensor | None] = [None] * len(prompts)
    inputs = [list(prompt[:-1]) for prompt in prompts]
    if not any(inputs):
        return found
    num_logits = max((k for k in back if k is not None), default=0)
    t = time.perf_counter()
    logits = batch.feed(inputs, num_logits)
    elapsed = (time.perf_counter() - t) / len(prompts)
    for b, prompt_stats in enumerate(stats):
        prompt_stats.model_forward_passes += 1
        prompt_stats.model_seconds += elapsed
        if back[b] is not None:
            found[b] = logits[b, num_logits - back[b]].clone()
    return found
