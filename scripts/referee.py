"""The referee: this library, faster-whisper and openai-whisper on the same weights and recordings, item by item.

    python scripts/referee.py [--set fleurs|english|FOLDER ...] [--limit N] [--model base] [--threads 2]
                              [--out docs/figures/referee-fleurs] [--save-checkpoint base.pt]

openai-whisper's `transcribe()` defines Whisper's transcription rules; it runs the bundled weights converted into
its state-dict layout (`eval.backends.openai_whisper`; `--save-checkpoint PATH` also writes them where
`whisper.load_model(PATH)` reads them). Each implementation transcribes each recording at temperature 0 only
(a fallback samples, and samples cannot be compared), greedy, the language given, timestamps and the previous
text as openai-whisper's defaults have them. Per item the script reports whether the texts agree; where ours
parts from openai-whisper's, the window and the first token at which the tokens part, and the top candidates
there for each implementation with the same tokens before them (openai-whisper's window prompt and tokens):
the raw logits of ours and openai-whisper's model, and faster-whisper's own next token there (CTranslate2 gives
no raw logits after a prefix: its `generate` applies the timestamp rules as if the prefix were a prompt). For every
window openai-whisper decoded, the largest difference of each implementation's log-mel features from openai's,
over the window's audio frames and over its padding.

Writes OUT.json (everything) and OUT.md (the summary and the items that part); needs openai-whisper and
faster-whisper (`pip install -e ".[baselines]"`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from benchlib import EVALDATA, wer_items  # noqa: E402

SETS = {"english": ("librispeech", "ljspeech", "fleurs", "clips", "spontaneous", "longform"), "fleurs": ("fleurs",)}
TOP = 5


def _windows(segments: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """(seek, tokens) per window, from segments in order (a window's segments share its seek)."""
    windows: list[tuple[int, list[int]]] = []
    for seek, tokens in segments:
        if windows and windows[-1][0] == seek:
            windows[-1][1].extend(tokens)
        else:
            windows.append((seek, list(tokens)))
    return windows


def first_parting(a: list[tuple[int, list[int]]], b: list[tuple[int, list[int]]]) -> dict | None:
    """Where two decodings' windows part: the window's index and seek, and the first differing token's index."""
    for w, (wa, wb) in enumerate(zip(a, b)):
        if wa != wb:
            if wa[0] != wb[0]:
                return {"window": w, "seek": wa[0], "other_seek": wb[0], "token": None}
            ta, tb = wa[1], wb[1]
            token = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            return {"window": w, "seek": wa[0], "token": token}
    if len(a) != len(b):
        return {"window": min(len(a), len(b)), "seek": None, "token": None}
    return None


class Referee:
    def __init__(self, model_name: str, threads: int, checkpoint: Path | None) -> None:
        import whisper
        from faster_whisper import WhisperModel

        from asr.models.registry import load_model
        from eval.backends.ctranslate2 import ct2_folder
        from eval.backends.openai_whisper import openai_whisper_checkpoint, openai_whisper_model

        torch.set_num_threads(threads)
        self.whisper = whisper
        self.bundle = load_model(model_name)
        self.openai = openai_whisper_model(self.bundle)
        if checkpoint is not None:
            torch.save(openai_whisper_checkpoint(self.bundle), checkpoint)
            print(f"referee: wrote {checkpoint}", file=sys.stderr)
        folder = ct2_folder(model_name)
        self.fw = WhisperModel(str(folder), device="cpu", compute_type="float32", cpu_threads=threads) \
            if folder is not None else None
        self.tokenizer = whisper.tokenizer.get_tokenizer(self.openai.is_multilingual,
                                                         num_languages=self.openai.num_languages)

    def transcribe(self, samples: np.ndarray, language: str) -> dict[str, Any]:
        from dataclasses import replace

        from asr.options import TranscribeOptions
        from asr.transcription import transcribe

        options = replace(TranscribeOptions(), temperatures=(0.0,), language=language)
        ours = transcribe(self.bundle, samples, options)
        openai = self.whisper.transcribe(self.openai, samples, language=language, temperature=0.0, fp16=False,
                                         verbose=None)
        out = {"ours": (ours.text.strip(), _windows([(s.seek, s.tokens) for s in ours.segments])),
               "openai": (openai["text"].strip(), _windows([(s["seek"], s["tokens"]) for s in openai["segments"]]))}
        if self.fw is not None:
            segments, _ = self.fw.transcribe(samples, language=language, beam_size=1, temperature=0.0,
                                             vad_filter=False)
            segments = list(segments)
            out["faster-whisper"] = ("".join(s.text for s in segments).strip(),
                                     _windows([(s.seek, s.tokens) for s in segments]))
        return out

    # --- features -----------------------------------------------------------------------------------------

    def features(self, samples: np.ndarray, seek: int) -> dict[str, tuple[torch.Tensor, int]]:
        """Each implementation's normalised log-mel features of the window at `seek` (frames), and how many of
        its frames are audio (the rest is padding)."""
        from audio.constants import HOP_LENGTH, N_FRAMES, N_SAMPLES
        from audio.features import log_mel, margins, recording_floor

        whisper, n_mels = self.whisper, self.bundle.n_mels
        mel = whisper.log_mel_spectrogram(torch.from_numpy(samples), n_mels, padding=N_SAMPLES)
        content = mel.shape[-1] - N_FRAMES
        size = min(N_FRAMES, content - seek)
        out = {"openai": whisper.pad_or_trim(mel[:, seek:seek + size], N_FRAMES)}
        start = seek * HOP_LENGTH
        window = samples[start:start + N_SAMPLES]
        # As `asr.transcription` computes a window's features.
        out["ours"] = log_mel([window], n_mels, floors=[recording_floor(samples, n_mels)],
                              around=[margins(samples, start, start + len(window))])[0]
        if self.fw is not None:
            from faster_whisper.audio import pad_or_trim

            fw_mel = self.fw.feature_extractor(samples)
            out["faster-whisper"] = torch.from_numpy(pad_or_trim(fw_mel[:, seek:seek + size]))
        return {name: (features.float(), size) for name, features in out.items()}

    # --- the candidates where the tokens part ------------------------------------------------------------------

    def candidates(self, features: dict[str, tuple[torch.Tensor, int]], prefix: list[int]) -> dict[str, list]:
        """The top candidates after `prefix` (a whole decoder input), for each implementation on its features."""
        decode = self.tokenizer.decode_with_timestamps
        tokens = torch.tensor([prefix])
        out = {}
        with torch.inference_mode():
            mel = features["openai"][0][None]
            logits = self.openai.logits(tokens, self.openai.embed_audio(mel))[0, -1]
            out["openai"] = _top(logits, decode)
            logits = self.bundle.model(input_features=features["ours"][0][None], decoder_input_ids=tokens).logits
            out["ours"] = _top(logits[0, -1], decode)
        return out

    def window_prefix(self, windows: list[tuple[int, list[int]]], index: int, language: str, token: int) -> list[int]:
        """openai-whisper's decoder input at `token` of window `index`: the previous windows' tokens as the prompt,
        the start sequence, then the window's tokens before `token`."""
        tok = self.tokenizer
        previous = [t for _, tokens in windows[:index] for t in tokens]
        prompt = [tok.sot_prev, *previous[-(self.openai.dims.n_text_ctx // 2 - 1):]] if previous else []
        start = [tok.sot, tok.special_tokens[f"<|{language}|>"], tok.transcribe] if self.openai.is_multilingual \
            else [tok.sot]
        return prompt + start + windows[index][1][:token]


def _top(logits: torch.Tensor, decode) -> list[list]:
    values, ids = logits.float().topk(TOP)
    return [[int(i), decode([int(i)]), round(float(v), 3)] for v, i in zip(values, ids)]


def compare_item(referee: Referee, item: dict) -> dict:
    from audio.load import load_audio

    samples = load_audio(item["audio"])
    language = item["language"]
    texts = referee.transcribe(samples, language)
    row: dict[str, Any] = {"id": item["id"], "language": language, "reference": item["text"],
                           "texts": {name: text for name, (text, _) in texts.items()}}
    openai_windows = texts["openai"][1]
    row["same_as_openai"] = {name: text == texts["openai"][0] for name, (text, _) in texts.items() if name != "openai"}
    # Features of every window openai-whisper decoded.
    row["features"] = []
    for seek, _ in openai_windows:
        features = referee.features(samples, seek)
        reference, size = features["openai"]
        diffs = {name: {"audio_frames": round(float((f[:, :size] - reference[:, :size]).abs().max()), 6),
                        "padding_frames": round(float((f[:, size:] - reference[:, size:]).abs().max()), 6)
                        if size < f.shape[-1] else None}
                 for name, (f, _) in features.items() if name != "openai"}
        row["features"].append({"seek": seek, "audio_frames": size, "max_abs_difference": diffs})
    parting = first_parting(texts["ours"][1], openai_windows)
    if parting is not None and parting["token"] is not None:
        index, token = parting["window"], parting["token"]
        window_tokens = openai_windows[index][1]
        parting["openai_next"] = referee.tokenizer.decode_with_timestamps(window_tokens[token:token + 1])
        ours_tokens = texts["ours"][1][index][1]
        parting["ours_next"] = referee.tokenizer.decode_with_timestamps(ours_tokens[token:token + 1])
        parting["before"] = referee.tokenizer.decode_with_timestamps(window_tokens[max(0, token - 8):token])
        if "faster-whisper" in texts and len(texts["faster-whisper"][1]) > index:
            fw_seek, fw_tokens = texts["faster-whisper"][1][index]
            if fw_seek == openai_windows[index][0] and fw_tokens[:token] == window_tokens[:token]:
                parting["faster_whisper_next"] = referee.tokenizer.decode_with_timestamps(fw_tokens[token:token + 1])
        prefix = referee.window_prefix(openai_windows, index, language, token)
        parting["candidates"] = referee.candidates(referee.features(samples, openai_windows[index][0]), prefix)
    row["ours_parts_from_openai"] = parting
    return row


def summary(rows: list[dict]) -> dict:
    from eval.wer import error_counts

    names = list(rows[0]["texts"]) if rows else []
    out: dict[str, Any] = {"items": len(rows), "identical_to_openai": {}, "wer": {}}
    for name in names:
        if name != "openai":
            out["identical_to_openai"][name] = sum(r["same_as_openai"][name] for r in rows)
        total = None
        for language in sorted({r["language"] for r in rows}):
            mine = [r for r in rows if r["language"] == language]
            counts = error_counts([r["reference"] for r in mine], [r["texts"][name] for r in mine], language)
            total = counts if total is None else total + counts
        out["wer"][name] = round(100 * total.rate, 2) if total is not None else None
    return out


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "(unknown)"


def write_markdown(path: Path, rows: list[dict], totals: dict, args: argparse.Namespace) -> None:
    names = list(totals["wer"])
    lines = [f"# Referee: {', '.join(args.set)} ({totals['items']} items, `{args.model}`, temperature 0, greedy)", "",
             "Written by `python scripts/referee.py " + " ".join(sys.argv[1:]) + f"` at commit {_commit()}.", "",
             "| implementation | WER % | texts identical to openai-whisper's |", "| --- | --- | --- |"]
    for name in names:
        same = totals["identical_to_openai"].get(name)
        agreement = "(itself)" if same is None else f"{same} of {totals['items']}"
        lines.append(f"| {name} | {totals['wer'][name]} | {agreement} |")
    worst = {}
    for row in rows:
        for window in row["features"]:
            for name, diff in window["max_abs_difference"].items():
                for part, value in diff.items():
                    if value is not None:
                        worst[(name, part)] = max(worst.get((name, part), 0.0), value)
    lines += ["", "Largest log-mel difference from openai-whisper's features over every window it decoded:", "",
              "| implementation | audio frames | padding frames |", "| --- | --- | --- |"]
    for name in [n for n in names if n != "openai"]:
        lines.append(f"| {name} | {worst.get((name, 'audio_frames'), 0):.2g} | "
                     f"{worst.get((name, 'padding_frames'), 0):.2g} |")
    parted = [r for r in rows if r["ours_parts_from_openai"] is not None]
    lines += ["", f"## Items where ours parts from openai-whisper ({len(parted)})", ""]
    for row in parted:
        p = row["ours_parts_from_openai"]
        lines += [f"- **{row['id']}**, window {p['window']} (seek {p['seek']}), token {p['token']}: "
                  f"after `{p.get('before', '')}` ours `{p.get('ours_next', '')}`, openai `{p.get('openai_next', '')}`"
                  + (f", faster-whisper `{p['faster_whisper_next']}`" if "faster_whisper_next" in p else "")]
        for name, top in p.get("candidates", {}).items():
            lines.append(f"  - {name}: " + ", ".join(f"`{text}` {value}" for _, text, value in top))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", nargs="+", default=["fleurs"],
                        help="fleurs (50 clips, 5 languages), english (the 65 English WER recordings) or folders of "
                             "the evaluation data")
    parser.add_argument("--limit", type=int, help="the first N items only")
    parser.add_argument("--model", default="base")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="OUT.json and OUT.md (default: print the summary only)")
    parser.add_argument("--save-checkpoint", type=Path, help="also write the openai-whisper checkpoint here")
    args = parser.parse_args()
    items = []
    for name in args.set:
        folders = SETS.get(name, (name,))
        items += wer_items(folders, language="en" if name == "english" else None, skip_missing=True)
    items = items[:args.limit] if args.limit else items
    if not items:
        sys.exit(f"referee: no recordings fit for WER in {', '.join(args.set)} under {EVALDATA}")
    referee = Referee(args.model, args.threads, args.save_checkpoint)
    rows = []
    for n, item in enumerate(items, 1):
        rows.append(compare_item(referee, item))
        same = rows[-1]["same_as_openai"]
        print(f"[{n}/{len(items)}] {item['id']}: " + ", ".join(f"{k} {'=' if v else '!='} openai"
                                                              for k, v in same.items()), file=sys.stderr)
    totals = summary(rows)
    print(json.dumps(totals, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"summary": totals, "items": rows}, ensure_ascii=False,
                                                            indent=1) + "\n", encoding="utf-8")
        write_markdown(args.out.with_suffix(".md"), rows, totals, args)


if __name__ == "__main__":
    main()
