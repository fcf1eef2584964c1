"""Training windows for a draft model: audio, pseudo-labelled by the model's own greedy decoding, cached on disk.

The draft has to predict what the model will say, window by window, as the model sees each window in real
use: long files go through the sequential algorithm (previous text as prompt, timestamp tokens, seeking), and
the model's greedy tokens are the labels, whatever was actually spoken (distil-whisper's pseudo-labelling).
Each window is stored once as a safetensors file in the work folder, so an interrupted run resumes:

    audio/NNNNNN.flac, audio/manifest.jsonl   synthesised recordings (`--tts`) and the text they speak
    windows/NNNNNN.safetensors                 encoder output [1500, d] (fp16), prompt, tokens, the model's
                                               top-k logits [len(tokens) + 1, k] at each position
    labelled.jsonl                             one line per source item done: id, windows, held-out flag
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from asr.distill.tts import SynthesizerError, Voice, available_voices, degrade, synthesize
from asr.transcription import DecodedWindow, transcribe_many
from asr.options import TranscribeOptions
from asr.whisper.decoder import WhisperDecoderAdapter
from audio import SAMPLE_RATE

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

logger = logging.getLogger(__name__)

# Engines drawn for each synthesised recording (espeak-ng has by far the most voices; the others sound
# more natural, so they are drawn more often than their voice count would give; Piper's neural voices most of all).
ENGINE_WEIGHTS = {"espeak-ng": 0.5, "flite": 0.3, "festival": 0.2, "piper": 1.0}
# Sentences in a row that the synthesisers fail to speak before synthesis gives up.
MAX_FAILURES = 20


@dataclass(frozen=True)
class Window:
    """One cached training window."""

    encoder_output: torch.Tensor  # [frames, d_model]
    prompt: torch.Tensor  # [P] decoder prompt
    tokens: torch.Tensor  # [T] the model's greedy tokens, end-of-text excluded
    top_ids: torch.Tensor  # [T + 1, k] the model's top-k token ids at each generated position
    top_logits: torch.Tensor  # [T + 1, k] their logits


def load_window(path: Path) -> Window:
    t = load_file(str(path))
    return Window(t["encoder_output"].float(), t["prompt"].long(), t["tokens"].long(), t["top_ids"].long(),
                  t["top_logits"].float())


def built_in_text() -> list[str]:
    """The built-in corpus: sentences of the Python documentation (see scripts/make_draft_corpus.py)."""
    text = resources.files("asr.distill").joinpath("corpus.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_text(path: str) -> list[str]:
    """Sentences (one per non-empty line) of a user's text file.

    Raises:
        ValueError: the file cannot be read or holds no text.
    """
    try:
        lines = [line.strip() for line in Path(path).expanduser().read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read text ({error})") from None
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError(f"{path}: no text in the file")
    return lines


def synthesize_recordings(folder: Path, sentences: list[str], minutes: float, seed: int,
                          progress: Callable[[int], None] | None = None) -> list[Path]:
    """Synthesises about `minutes` of speech into `folder` (kept across runs; existing files are reused).

    Half the recordings are short clips of one to three sentences (3-20 s, as in read-speech corpora), half
    long recordings of 40-150 s in one voice with pauses between sentences, decoded by the model window after
    window. Each recording draws its engine, voice, speaking rate, pitch and recording conditions.

    Raises:
        SynthesizerError: no synthesiser is installed.
    """
    import soundfile as sf

    voices = available_voices()
    by_engine: dict[str, list[Voice]] = {}
    for voice in voices:
        by_engine.setdefault(voice.engine, []).append(voice)
    engines = sorted(by_engine)
    weights = np.array([ENGINE_WEIGHTS.get(e, 0.1) for e in engines])
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest.jsonl"
    done = {}
    if manifest.is_file():
        for line in manifest.read_text().splitlines():
            try:
                row = json.loads(line)
                done[row["audio"]] = row["seconds"]
            except (ValueError, KeyError):
                continue  # a line cut by an interrupted run: that recording is made again
    paths, total, index, failures = [], 0.0, 0, 0
    with manifest.open("a") as out:
        while total < minutes * 60:
            name = f"{index:06d}.flac"
            rng = np.random.default_rng([seed, index])
            index += 1
            if name in done and (folder / name).is_file():
                paths.append(folder / name)
                total += done[name]
                continue
            engine = engines[int(rng.choice(len(engines), p=weights / weights.sum()))]
            voice = by_engine[engine][int(rng.integers(len(by_engine[engine])))]
            long = rng.random() < 0.5
            count = int(rng.integers(8, 25)) if long else int(rng.integers(1, 4))
            start = int(rng.integers(len(sentences)))
            text = [sentences[(start + i) % len(sentences)] for i in range(count)]
            pieces = [np.zeros(int(rng.uniform(0.1, 0.6) * SAMPLE_RATE), np.float32)]
            for sentence in text:
                try:
                    pieces.append(synthesize(voice, sentence, rng))
                    failures = 0
                except SynthesizerError as error:
                    # One sentence an engine cannot speak loses that sentence, not the run; an engine that
                    # fails every time stops it.
                    failures += 1
                    if failures >= MAX_FAILURES:
                        raise SynthesizerError(f"{error} ({failures} times in a row)") from None
                    logger.warning("%s; the sentence is left out", error)
                    continue
                pieces.append(np.zeros(int(rng.uniform(0.15, 1.2 if long else 0.5) * SAMPLE_RATE), np.float32))
            if len(pieces) == 1:
                continue  # nothing was spoken
            samples = degrade(np.concatenate(pieces), rng)
            seconds = len(samples) / SAMPLE_RATE
            if not long and seconds > 29.0:
                samples, seconds = samples[: 29 * SAMPLE_RATE], 29.0
            sf.write(str(folder / name), samples, SAMPLE_RATE, subtype="PCM_16")
            out.write(json.dumps({"audio": name, "seconds": round(seconds, 3), "engine": voice.engine,
                                  "voice": voice.name, "text": " ".join(text)}) + "\n")
            out.flush()
            paths.append(folder / name)
            total += seconds
            if progress is not None:
                progress(int(seconds))
    return paths


# Marks an altered take of a recording in its item id: "audio:talk.wav#take2" is a take of "audio:talk.wav".
TAKE = "#take"


def held_out(item_id: str, fraction: float) -> bool:
    """Whether a source item is kept out of training (decided by its id, so it stays so across runs; the
    altered takes of a recording go where the recording goes, so no held-out speech is trained on)."""
    digest = int(hashlib.sha256(item_id.split(TAKE)[0].encode()).hexdigest()[:8], 16)
    return digest / 0xFFFFFFFF < fraction


def label_items(bundle: WhisperBundle, items: Iterator[tuple[str, Callable[[], np.ndarray]]], work: Path, *,
                options: TranscribeOptions, top_k: int, held_out_fraction: float, batch_size: int = 8,
                group_size: int = 48, progress: Callable[[float], None] | None = None) -> dict[str, int]:
    """Decodes every item with the model (greedy, sequential algorithm) and caches each window it decoded.

    Args:
        items: (id, function returning 16 kHz samples) pairs; an item whose audio fails is skipped with a warning.
        work: the work folder; items listed in its `labelled.jsonl` are not decoded again.
        group_size: items decoded per call, `batch_size` windows at a time (an item that finishes makes room
            for the next), and recorded as done together.
        progress: called with the seconds of audio done after each group of items.

    Returns:
        Counts of `items`' own (labelled now or by an earlier run): items, windows, held-out windows, failed items.
    """
    from audio import AudioError

    windows_dir = work / "windows"
    windows_dir.mkdir(parents=True, exist_ok=True)
    labelled = work / "labelled.jsonl"
    done = labelled_items(labelled)
    counts = {"items": 0, "windows": 0, "held_out_windows": 0, "failed": 0}
    next_index = sum(1 for _ in windows_dir.glob("*.safetensors"))
    group: list[tuple[str, np.ndarray]] = []

    def flush() -> None:
        nonlocal next_index
        if not group:
            return
        seen: list[list[DecodedWindow]] = [[] for _ in group]
        transcribe_many(bundle, [samples for _, samples in group], options, None, batch_size=batch_size,
                        window_observer=lambda window: seen[window.audio_index].append(window))
        with labelled.open("a") as out:
            for (item_id, samples), windows in zip(group, seen):
                is_held = held_out(item_id, held_out_fraction)
                kept = 0
                for window in windows:
                    if window.temperature != 0.0 or not window.tokens:
                        continue  # a sampled fallback or an empty window: nothing greedy to agree with
                    _save_window(bundle, window, windows_dir / f"{next_index:06d}.safetensors", top_k)
                    next_index += 1
                    kept += 1
                out.write(json.dumps({"id": item_id, "windows": kept, "held_out": is_held,
                                      "first": next_index - kept, "seconds": round(len(samples) / SAMPLE_RATE, 2)})
                          + "\n")
                out.flush()
                counts["items"] += 1
                counts["windows"] += kept
                counts["held_out_windows"] += kept if is_held else 0
        if progress is not None:
            progress(sum(len(s) for _, s in group) / SAMPLE_RATE)
        group.clear()

    for item_id, load in items:
        if item_id in done:  # labelled by an earlier run: counted, not decoded again
            row = done[item_id]
            counts["items"] += 1
            counts["windows"] += row["windows"]
            counts["held_out_windows"] += row["windows"] if row["held_out"] else 0
            continue
        try:
            samples = load()
        except AudioError as error:
            logger.warning("skipping %s", error)
            counts["failed"] += 1
            continue
        group.append((item_id, samples))
        if len(group) == group_size:
            flush()
    flush()
    return counts


def labelled_items(path: Path) -> dict[str, dict]:
    """The rows of `labelled.jsonl` by item id (a line cut by an interrupted run is ignored)."""
    done = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                done[row["id"]] = row
            except (ValueError, KeyError):
                continue
    return done


@torch.inference_mode()
def window_from_decoded(bundle: WhisperBundle, decoded: DecodedWindow, top_k: int) -> Window:
    """A training window: what the model decoded, with its top-k logits at each generated position (the
    position after the last token predicts end-of-text)."""
    encoder_output = decoded.encoder_output[None]
    decoder = WhisperDecoderAdapter(bundle.model, encoder_output)
    ids = torch.tensor([decoded.prompt + decoded.tokens], device=encoder_output.device)
    logits = decoder.forward(ids, decoder.new_cache(1), len(decoded.tokens) + 1)[0]
    values, indices = logits.topk(top_k, dim=-1)
    return Window(decoded.encoder_output.float().cpu(), torch.tensor(decoded.prompt), torch.tensor(decoded.tokens),
                  indices.cpu(), values.float().cpu())


def _save_window(bundle: WhisperBundle, decoded: DecodedWindow, path: Path, top_k: int) -> None:
    """Caches a window (encoder output and logits in float16)."""
    window = window_from_decoded(bundle, decoded, top_k)
    save_file({
        "encoder_output": window.encoder_output.to(torch.float16).contiguous(),
        "prompt": window.prompt.to(torch.int32),
        "tokens": window.tokens.to(torch.int32),
        "top_ids": window.top_ids.to(torch.int32).contiguous(),
        "top_logits": window.top_logits.to(torch.float16).contiguous(),
    }, str(path))
