"""The `asr distill` pipeline: train a small draft that agrees with a Whisper model, to assist it.

1. Audio: the user's own recordings (`audio`, any source `asr batch` reads) and/or speech synthesised here
   (`tts`), reading the user's text or the built-in corpus.
2. Labels: the model decodes every recording greedily, window after window as in real use; each window's
   encoder output, prompt, tokens and the model's top-k logits are cached in the work folder.
3. Training: the draft (a few of the model's decoder layers) learns to predict the model's tokens.
4. The draft folder, with its training report, and the agreement on held-out recordings it never saw.

Every stage resumes from the work folder, so an interrupted run given the same command goes on where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from asr.distill.train import TrainOptions

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

__all__ = ["DistillOptions", "TrainOptions", "distill"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillOptions:
    """What to train a draft model on, and how."""

    # Audio: a folder, manifest or dataset of the user's recordings (pseudo-labelled by the model), and/or
    # synthesised speech (`tts`) reading `text` (a file, one sentence a line; None: the built-in corpus).
    audio: str | None = None
    tts: bool = False
    text: str | None = None
    tts_minutes: float = 60.0
    # Language of the user's recordings (None: the model detects it per file); synthesised speech is English.
    language: str | None = None
    # Altered takes of each of the user's recordings (speed, room, telephone band, noise, level), each labelled
    # by the model as heard: more acoustic variety from a few hours of real speech.
    augment: int = 0
    # The model's decoder layers the draft starts from (None: the first and the last, as distil-whisper).
    layers: tuple[int, ...] | None = None
    # Text tokens the draft may propose (None: all): a smaller output head makes each draft step cheaper.
    vocabulary: int | None = None
    # The model's top-k logits kept per position, and the share of recordings held out to measure agreement.
    top_k: int = 64
    held_out: float = 0.1
    # Recordings decoded together while labelling.
    label_batch_size: int = 8
    seed: int = 0
    train: TrainOptions = field(default_factory=TrainOptions)

    def __post_init__(self) -> None:
        if self.audio is None and not self.tts:
            raise ValueError("nothing to train on: give --audio SOURCE and/or --tts")
        if self.augment < 0:
            raise ValueError(f"--augment must be >= 0 takes, got {self.augment}")
        if self.augment and self.audio is None:
            raise ValueError("--augment alters the --audio recordings; add --audio SOURCE")
        if self.text is not None and not self.tts:
            raise ValueError("--text is the text that --tts speaks; add --tts")
        if self.tts and not self.tts_minutes > 0:
            raise ValueError(f"--tts-minutes must be > 0, got {self.tts_minutes}")
        if not 0.0 < self.held_out < 1.0:
            raise ValueError(f"--held-out must be between 0 and 1, got {self.held_out}")
        if self.top_k < 1:
            raise ValueError(f"--top-k must be >= 1, got {self.top_k}")
        if self.label_batch_size < 1:
            raise ValueError(f"label batch size must be >= 1, got {self.label_batch_size}")
        if self.vocabulary is not None and self.vocabulary < 1:
            raise ValueError(f"--vocabulary must be >= 1 tokens, got {self.vocabulary}")
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)):
            raise ValueError(f"--layers must name distinct decoder layers, got {self.layers}")


def distill(model: str, output: str | Path, options: DistillOptions, *, work_dir: str | Path | None = None,
            device: str = "cpu", show_progress: bool = True) -> dict[str, Any]:
    """Trains a draft model for `model` and writes it to `output` (a new folder), usable as `--assistant output`.

    Args:
        model: a model name, hub id or folder, as `asr transcribe --model` takes.
        work_dir: where audio, labelled windows and checkpoints are cached (default: `output` + ".work").

    Returns:
        The training report (also stored in the draft's `draft.json`).

    Raises:
        ValueError: the output exists, the model cannot be loaded, no synthesiser for `tts`, a source with no
            usable audio, or a work folder made by a different recipe.
    """
    from asr.assist.draft_model import DraftDecoder, save_draft
    from asr.distill.data import built_in_text, read_text
    from asr.distill.tts import available_voices
    from asr.models.registry import load_model

    output = Path(output).expanduser()
    if output.exists():
        raise ValueError(f"{output} exists; choose a new output folder")
    work = Path(work_dir).expanduser() if work_dir is not None else output.with_name(output.name + ".work")
    sentences = None
    if options.tts:
        available_voices()  # fails now, in one line, if nothing can speak
        sentences = read_text(options.text) if options.text else built_in_text()
    bundle = load_model(model, device=device, dtype=torch.float32)
    layers = options.layers or tuple(sorted({0, bundle.model.config.decoder_layers - 1}))
    fresh = _claim_work(work, model, options)

    # 1-2. Audio, decoded by the model; every window it decoded is cached with its labels.
    try:
        counts = _label(bundle, work, options, sentences, show_progress)
    except ValueError:
        if fresh:  # a typo in --audio, say: the corrected command must find the folder free again
            _release_work(work)
        raise
    train, held = _split(work)
    if not train:
        raise ValueError(f"no usable audio in {options.audio or 'the synthesised speech'}: the model decoded no "
                         "speech in it")

    # 3. Train the draft's own layers.
    from asr.distill.data import load_window
    from asr.distill.train import train_draft

    draft = DraftDecoder(bundle.model, layers)
    held_windows = [load_window(p) for p in held]
    special = bundle.special
    bar = _bar(options.train.steps, "training", "step", show_progress)

    def on_step(step: int, loss: float, agreement: float | None) -> None:
        if bar is not None:
            bar.n = step
            bar.set_postfix(loss=f"{loss:.3f}", held_out=f"{agreement:.1%}" if agreement is not None else "-")

    try:
        history = train_draft(draft, train, held_windows, work, options.train, eot=special.eot,
                              suppress=special.suppress_tokens, device=device, progress=on_step)
    finally:
        if bar is not None:
            bar.close()

    # 4. A restricted vocabulary, chosen from the training labels; agreement measured again with it.
    if options.vocabulary is not None:
        from asr.assist.draft_model import choose_vocabulary
        from asr.distill.train import agreement

        ids = choose_vocabulary(_label_counts(train), options.vocabulary, special.eot, bundle.model.config.vocab_size)
        draft.restrict_vocabulary(ids.to(next(draft.parameters()).device))
        history["agreement_full_vocabulary"] = history["agreement"]
        history["agreement"] = agreement(draft, held_windows, eot=special.eot, suppress=special.suppress_tokens,
                                         device=device).rate
        history["vocabulary"] = len(ids)

    # 5. The draft folder, written aside and renamed into place.
    report = {"model": model, "model_source": bundle.source, "layers": list(layers), "data": counts,
              "train_windows": len(train), "held_out_windows": len(held), **history,
              "recipe": _recipe(model, options)}
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    save_draft(draft, bundle.model, partial, model_name=model, training=report)
    partial.rename(output)
    logger.info("draft written to %s: held-out agreement %.1f%%", output, 100 * history["agreement"])
    return report


def _label_counts(paths: list[Path]) -> dict[int, int]:
    """How often the model emitted each token in the given cached windows."""
    from collections import Counter

    from safetensors import safe_open

    counts: Counter[int] = Counter()
    for path in paths:
        with safe_open(str(path), "pt") as handle:
            counts.update(handle.get_tensor("tokens").tolist())
    return dict(counts)


def _recipe(model: str, options: DistillOptions) -> dict[str, Any]:
    """What decides the cached data: a work folder serves only the recipe that made it."""
    return {"model": model, "audio": options.audio, "tts": options.tts, "text": options.text,
            "tts_minutes": options.tts_minutes if options.tts else None, "language": options.language,
            "augment": options.augment, "top_k": options.top_k, "held_out": options.held_out, "seed": options.seed}


def _claim_work(work: Path, model: str, options: DistillOptions) -> bool:
    """Creates the work folder, or checks that an existing one was made by the same recipe; True when this run
    made the claim.

    Raises:
        ValueError: the folder cannot be created, or it holds another recipe's data.
    """
    recipe = _recipe(model, options)
    marker = work / "recipe.json"
    if marker.is_file():
        try:
            found = json.loads(marker.read_text())
        except ValueError:
            found = None
        if found != recipe:
            raise ValueError(f"work folder {work} holds data of another recipe; delete it or pass another --work-dir")
        logger.info("resuming from work folder %s", work)
        return False
    try:
        work.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(recipe, indent=2) + "\n")
    except OSError as error:
        raise ValueError(f"cannot create work folder {work}: {error.strerror or error}") from None
    return True


def _release_work(work: Path) -> None:
    """Undoes a claim that cached nothing: the recipe marker and empty folders go; any data stays claimed."""
    if any(p.is_file() and p.name != "recipe.json" for p in work.rglob("*")):
        return
    (work / "recipe.json").unlink(missing_ok=True)
    for folder in sorted((p for p in work.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()
    work.rmdir()


def _label(bundle: WhisperBundle, work: Path, options: DistillOptions, sentences: list[str] | None,
           show_progress: bool) -> dict[str, Any]:
    """Synthesises (when asked) and decodes all audio into cached windows; returns counts per kind."""
    from asr.batch.sources import iter_items, load_item_audio
    from asr.distill.data import TAKE, synthesize_recordings
    from asr.distill.tts import perturb
    from asr.options import TranscribeOptions
    from audio import load_audio

    # Greedy only: a draft model is trained to agree with greedy decoding, and sampled fallbacks would be dropped.
    counts: dict[str, Any] = {}
    label = dict(top_k=options.top_k, held_out_fraction=options.held_out, batch_size=options.label_batch_size)
    if options.tts:
        bar = _bar(round(options.tts_minutes * 60), "synthesising", "s", show_progress)
        try:
            paths = synthesize_recordings(work / "audio", sentences, options.tts_minutes, options.seed,
                                          progress=None if bar is None else bar.update)
        finally:
            if bar is not None:
                bar.close()
        items = ((f"tts:{p.name}", lambda p=p: load_audio(str(p))) for p in paths)
        counts["tts"] = _decode_all(bundle, work, items, TranscribeOptions(language="en", temperatures=(0.0,)),
                                    label, "labelling speech", show_progress)
    if options.audio is not None:
        def user_items() -> Iterator:
            for item in iter_items(options.audio):
                yield f"audio:{item.id}", lambda item=item: load_item_audio(item)
                for take in range(1, options.augment + 1):
                    yield f"audio:{item.id}{TAKE}{take}", lambda item=item, take=take: _altered(item, take)

        def _altered(item, take: int):
            # Each take draws its own alterations, the same in every run (resuming relabels nothing).
            digest = int(hashlib.sha256(item.id.encode()).hexdigest()[:8], 16)
            return perturb(load_item_audio(item), np.random.default_rng([options.seed, digest, take]))

        found = _decode_all(bundle, work, user_items(),
                            TranscribeOptions(language=options.language, temperatures=(0.0,)), label,
                            f"labelling {options.audio}", show_progress)
        if found["items"] == 0:
            raise ValueError(f"{options.audio}: no usable audio ({found['failed']} item(s) could not be read)")
        counts["audio"] = found
    return counts


def _decode_all(bundle: WhisperBundle, work: Path, items: Iterator, options: Any, label: dict, what: str,
                show_progress: bool) -> dict[str, int]:
    from asr.distill.data import label_items

    bar = _bar(None, what, "s", show_progress)
    try:
        return label_items(bundle, items, work, options=options, progress=None if bar is None else bar.update,
                           **label)
    finally:
        if bar is not None:
            bar.close()


def _split(work: Path) -> tuple[list[Path], list[Path]]:
    """Cached windows for training and held-out ones, by recording (the last one is held out if none is)."""
    from asr.distill.data import labelled_items

    rows = [row for row in labelled_items(work / "labelled.jsonl").values() if row["windows"] > 0]
    held_rows = [row for row in rows if row["held_out"]]
    if not held_rows and len(rows) > 1:
        held_rows = rows[-1:]
    held_ids = {row["id"] for row in held_rows}

    def paths(selected: list[dict]) -> list[Path]:
        return [work / "windows" / f"{i:06d}.safetensors" for row in selected
                for i in range(row["first"], row["first"] + row["windows"])]

    return paths([r for r in rows if r["id"] not in held_ids]), paths(held_rows)


def _bar(total: int | None, description: str, unit: str, show: bool):
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
