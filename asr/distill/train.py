"""Training a draft model to agree with its model: knowledge distillation on cached windows.

The loss at every generated position is the cross-entropy to the model's greedy token (what the draft must
propose to be accepted) plus the cross-entropy to the model's distribution over its top-k tokens (Hinton et
al. 2015; distil-whisper weighs the same two terms). Only the draft's own layers and final norm learn; the
embeddings and head it shares with the model stay frozen. AdamW with a linear warm-up and cosine decay.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from asr.assist.draft_model import DraftDecoder
from asr.distill.data import Window, load_window

logger = logging.getLogger(__name__)


def checkpoint_path(work: Path, draft: DraftDecoder) -> Path:
    """The draft's checkpoint in the work folder, named by the teacher layers it starts from: drafts of other
    layers (`--layers`) trained on the same cached data keep their own."""
    return work / f"checkpoint-{'-'.join(map(str, draft.teacher_layers))}.safetensors"


@dataclass(frozen=True)
class TrainOptions:
    """How long and how a draft model trains."""

    # Optimiser steps, and a wall-clock budget in minutes that ends training early (None: no budget).
    steps: int = 3000
    max_minutes: float | None = None
    # Windows per step, peak learning rate and its linear warm-up.
    windows_per_step: int = 4
    learning_rate: float = 3e-4
    warmup_steps: int = 100
    # Held-out agreement is measured (and the checkpoint written) every this many steps.
    eval_every: int = 250
    # Forward and backward in bfloat16 (autocast) where the processor computes it natively (CPUs with
    # AVX512-BF16 or AMX, CUDA): about twice as fast on such CPUs; weights and optimiser stay in float32.
    mixed_precision: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.windows_per_step < 1 or self.eval_every < 1 or self.warmup_steps < 0:
            raise ValueError("steps, windows per step and eval interval must be >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"learning rate must be > 0, got {self.learning_rate}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"the time budget must be > 0 minutes, got {self.max_minutes}")


@dataclass
class Agreement:
    """Teacher-forced top-1 agreement: positions where the draft's best token is the model's greedy token."""

    matched: int = 0
    positions: int = 0

    @property
    def rate(self) -> float:
        return self.matched / self.positions if self.positions else 0.0


def _batch(windows: Sequence[Window], pad: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Right-padded inputs, encoder outputs, and where the labelled positions are: `[B, L]`, `[B, F, d]`, mask."""
    sequences = [torch.cat([w.prompt, w.tokens]) for w in windows]
    length = max(len(s) for s in sequences)
    ids = torch.full((len(windows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(windows), length), dtype=torch.bool)
    for row, (w, s) in enumerate(zip(windows, sequences)):
        ids[row, : len(s)] = s
        mask[row, len(w.prompt) - 1: len(s)] = True  # predicts tokens[0], ..., tokens[-1], end-of-text
    encoder_output = torch.stack([w.encoder_output for w in windows])
    return ids.to(device), encoder_output.to(device), mask.to(device)


def _positions(draft: DraftDecoder, windows: Sequence[Window], eot: int, device: torch.device):
    """The draft's logits at every labelled position, with the labels and the model's top-k there."""
    ids, encoder_output, mask = _batch(windows, eot, device)
    dtype = next(draft.trainable().values().__iter__()).dtype
    hidden = draft.decoder(input_ids=ids, encoder_hidden_states=encoder_output.to(dtype),
                           use_cache=False).last_hidden_state
    logits = draft.proj_out(hidden[mask]).float()  # [N, vocab]: the head only where there is a label
    labels = torch.cat([torch.cat([w.tokens, torch.tensor([eot])]) for w in windows]).to(device)
    top_ids = torch.cat([w.top_ids for w in windows]).to(device)
    top_logits = torch.cat([w.top_logits for w in windows]).to(device)
    return logits, labels, top_ids, top_logits


def distillation_loss(logits: torch.Tensor, labels: torch.Tensor, top_ids: torch.Tensor,
                      top_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to the greedy labels plus cross-entropy to the model's top-k distribution.

    Args:
        logits: `[N, vocab]` the draft's logits; labels: `[N]`; top_ids, top_logits: `[N, k]` the model's.
    """
    log_q = F.log_softmax(logits, dim=-1)
    hard = F.nll_loss(log_q, labels)
    soft = -(F.softmax(top_logits, dim=-1) * log_q.gather(1, top_ids)).sum(-1).mean()
    return hard + soft


@torch.no_grad()
def agreement(draft: DraftDecoder, windows: Sequence[Window], *, eot: int, suppress: Sequence[int],
              device: torch.device | str = "cpu", batch: int = 8) -> Agreement:
    """Teacher-forced top-1 agreement of the draft with the model's greedy tokens on `windows`.

    The tokens Whisper never emits (`suppress`) are masked, as the draft's logit rules mask them when drafting.
    """
    device = torch.device(device)
    found = Agreement()
    suppressed = torch.tensor(list(suppress), dtype=torch.long, device=device)
    was_training = draft.training
    draft.eval()
    for start in range(0, len(windows), batch):
        logits, labels, _, _ = _positions(draft, windows[start: start + batch], eot, device)
        logits[:, suppressed] = -math.inf
        found.matched += int((logits.argmax(-1) == labels).sum())
        found.positions += len(labels)
    draft.train(was_training)
    return found


def train_draft(draft: DraftDecoder, train: list[Path], held: list[Window], work: Path, options: TrainOptions, *,
                eot: int, suppress: Sequence[int], device: str = "cpu",
                progress: Callable[[int, float, float | None], None] | None = None) -> dict:
    """Trains the draft in place on the cached windows `train`; resumes from its checkpoint in `work`.

    Args:
        held: held-out windows whose agreement is measured every `eval_every` steps and at the end.
        progress: called after each step with (step, loss, latest held-out agreement or None).

    Returns:
        What happened: steps, minutes, final loss and held-out agreement (before and after training).
    """
    if not train:
        raise ValueError("no training windows: the audio gave the model nothing to decode")
    torch_device = torch.device(device)
    params = draft.trainable()
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(list(params.values()), lr=options.learning_rate, weight_decay=0.01)
    checkpoint = checkpoint_path(work, draft)
    step, history = _restore(checkpoint, params, optimizer)
    if step == 0:
        history["agreement_before"] = agreement(draft, held, eot=eot, suppress=suppress, device=torch_device).rate

    def learning_rate(at: int) -> float:
        if at < options.warmup_steps:
            return options.learning_rate * (at + 1) / options.warmup_steps
        progress_ = (at - options.warmup_steps) / max(1, options.steps - options.warmup_steps)
        return options.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress_))))

    rng = random.Random(options.seed * 1_000_003 + step)
    order: list[Path] = []
    started = time.perf_counter()
    spent_before = history.get("minutes", 0.0)
    latest = history.get("agreement")
    loss_value = history.get("loss", float("nan"))  # a finished run resumed (a new --vocabulary): its last loss
    draft.train()
    while step < options.steps:
        minutes = spent_before + (time.perf_counter() - started) / 60
        if options.max_minutes is not None and minutes >= options.max_minutes:
            logger.info("time budget of %.1f minutes reached at step %d", options.max_minutes, step)
            break
        # 1. A batch of windows, in shuffled epochs.
        if len(order) < options.windows_per_step:
            order = list(train)
            rng.shuffle(order)
        windows = [load_window(order.pop()) for _ in range(min(options.windows_per_step, len(order)))]
        # 2. Loss at every labelled position, one optimiser step.
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        with _autocast(torch_device, options.mixed_precision):
            loss = distillation_loss(*_positions(draft, windows, eot, torch_device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        step += 1
        loss_value = loss.item()
        # 3. Now and then: held-out agreement and a checkpoint to resume from.
        if step % options.eval_every == 0 or step == options.steps:
            latest = agreement(draft, held, eot=eot, suppress=suppress, device=torch_device).rate
            history.update(agreement=latest, loss=loss_value,
                           minutes=spent_before + (time.perf_counter() - started) / 60)
            history.setdefault("curve", []).append([step, round(latest, 4)])
            _save_checkpoint(checkpoint, params, optimizer, step, history)
        if progress is not None:
            progress(step, loss_value, latest)
    draft.eval()
    final = agreement(draft, held, eot=eot, suppress=suppress, device=torch_device)
    history.update(steps=step, loss=loss_value, agreement=final.rate, held_out_positions=final.positions,
                   minutes=round(spent_before + (time.perf_counter() - started) / 60, 2),
                   options=asdict(options))
    _save_checkpoint(checkpoint, params, optimizer, step, history)
    for p in params.values():
        p.requires_grad_(False)
    return history


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 matrix products natively (so autocast pays)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and native_bf16(device))


def _save_checkpoint(path: Path, params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                     step: int, history: dict) -> None:
    """The draft's weights and the optimiser's moments, as safetensors (written aside, then renamed)."""
    tensors = {f"param.{name}": p.detach().cpu().contiguous() for name, p in params.items()}
    for name, p in params.items():
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"{key}.{name}"] = state[key].detach().cpu().contiguous()
    partial = path.with_suffix(".partial")
    save_file(tensors, str(partial), metadata={"step": str(step), "history": json.dumps(history)})
    partial.replace(path)


def _restore(path: Path, params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> tuple[int, dict]:
    """Loads a checkpoint into the draft and optimiser; (0, {}) when there is none."""
    if not path.is_file():
        return 0, {}
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata() or {}
    tensors = load_file(str(path))
    step = int(metadata.get("step", 0))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[f"param.{name}"].to(p.device, p.dtype))
            if f"exp_avg.{name}" in tensors:
                optimizer.state[p] = {"step": torch.tensor(float(step)),
                                      "exp_avg": tensors[f"exp_avg.{name}"].to(p.device),
                                      "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].to(p.device)}
    logger.info("resuming draft training at step %d", step)
    return step, json.loads(metadata.get("history", "{}"))
