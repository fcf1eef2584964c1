"""The default against plain decoding: `--assistant auto` (what `asr transcribe` does unless told otherwise) and
`--assistant none`, in every case a user meets, with the words checked.

    python scripts/bench_default.py [--out docs/figures/default-matrix] [--threads 2]
                                    [--placements memory,disk] [--sets short,long] [--limit N]

Cells: sequential decoding and `--batch-size 8` (speech chunks in batches), the model in float32 and in int8
(`--dtype int8`; in memory only, as an int8 model is not offloaded), in memory and with its decoder layers
offloaded to disk (`--offload disk`), over the English WER recordings of ../shared/evaldata: the 61 short ones
(`short`: LibriSpeech, LJ Speech, FLEURS, clips, spontaneous) and the long files (`long`: the three sonnets
joined, 158 s, and the VoxPopuli speech, 69 s; with the sonnets apart these are the 65). Each placement and
set is one `asr eval` run whose eight configurations (default and none, for each mode and precision) decode
each recording in turn, after a warm-up: a machine that slows down slows every configuration alike. Per cell:
seconds of the whole run and of the decoder, the ratio none / default (above 1: the default is faster), the
median of the per-recording ratios, whether every recording got the same words, the assistant that ran and its
acceptance; OUT.json also keeps each recording's seconds (none, default) and whether its words matched.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import soundfile as sf

from benchlib import (EVALDATA, SAMPLE_RATE, VOXPOPULI, command_line, figure_path, longform_rows, machine,
                      sonnets, sonnets_reference, use_threads, wer_items, write_figures)

# The 61 short recordings of the 65 English WER recordings (the other four are the long files).
SHORT_FOLDERS = ("librispeech", "ljspeech", "fleurs", "clips", "spontaneous")
MODES = {"sequential": ("greedy", "assisted"), "batch 8": ("batched:8", "batched:8,assistant=auto")}
DTYPES = ("float32", "int8")


def configurations(placement: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(mode, dtype) -> (the configuration with --assistant none, the one with the default). An int8 model is
    not offloaded (`--dtype int8` refuses `--offload`), so offloaded cells are float32 only."""
    cells = {}
    for mode, (plain, default) in MODES.items():
        for dtype in DTYPES if placement == "memory" else ("float32",):
            suffix = ",dtype=int8" if dtype == "int8" else ""
            cells[mode, dtype] = (plain + suffix, default + suffix)
    return cells


def manifest(set_name: str, folder: Path) -> Path:
    """A JSONL manifest of the set's recordings (the sonnets written joined into `folder`)."""
    import json

    if set_name == "short":
        rows = [{k: item[k] for k in ("id", "audio", "text", "language", "subset")}
                for item in wer_items(SHORT_FOLDERS)]
    else:
        sf.write(folder / "sonnets.wav", sonnets(), SAMPLE_RATE, subtype="FLOAT")
        rows = [{"id": "sonnets", "audio": str(folder / "sonnets.wav"), "text": sonnets_reference(),
                 "language": "en", "subset": "longform"},
                {"id": "voxpopuli", "audio": str(EVALDATA / "longform" / VOXPOPULI),
                 "text": longform_rows()[VOXPOPULI]["text"], "language": "en", "subset": "longform"}]
    path = folder / f"{set_name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run_cells(set_name: str, placement: str, limit: int | None, folder: Path) -> list[dict]:
    """One interleaved `asr eval` run of every configuration over the set; one row per (mode, dtype)."""
    from asr.models.offload import OffloadOptions
    from eval.evaluate import evaluate

    cells = configurations(placement)
    compare = [name for pair in cells.values() for name in pair]
    per_item: dict[str, dict[str, object]] = {}

    def on_item(item, results) -> None:
        per_item[item.id] = results

    offload = OffloadOptions("disk", folder=str(folder / "layers")) if placement == "disk" else None
    print(f"{placement}, {set_name}: {len(compare)} configurations", flush=True)
    evaluate([str(manifest(set_name, folder))], compare, model="base", language="en", limit=limit,
             on_item=on_item, on_message=print, offload=offload)
    rows = []
    for (mode, dtype), (plain, default) in cells.items():
        done = {item: (r[plain], r[default]) for item, r in per_item.items()
                if getattr(r.get(plain), "text", None) is not None and getattr(r.get(default), "text", None) is not None}
        pairs = list(done.values())
        if not pairs:
            continue
        none_s = sum(p.seconds for p, _ in pairs)
        default_s = sum(d.seconds for _, d in pairs)
        drafted = sum(d.drafted_tokens or 0 for _, d in pairs)
        rows.append({
            "set": set_name, "placement": placement, "mode": mode, "dtype": dtype, "recordings": len(pairs),
            "none_seconds": round(none_s, 3), "default_seconds": round(default_s, 3),
            "speedup": round(none_s / default_s, 3),
            "median_speedup": round(statistics.median(p.seconds / d.seconds for p, d in pairs), 3),
            "none_decode_seconds": round(sum(p.decode_seconds or 0 for p, _ in pairs), 3),
            "default_decode_seconds": round(sum(d.decode_seconds or 0 for _, d in pairs), 3),
            "same_words": all(p.text.strip() == d.text.strip() for p, d in pairs),
            "assistants": sorted({d.assistant or "none" for _, d in pairs}),
            "acceptance": round(sum(d.accepted_tokens or 0 for _, d in pairs) / drafted, 3) if drafted else None,
            "per_recording": {item: [round(p.seconds, 3), round(d.seconds, 3), p.text.strip() == d.text.strip()]
                              for item, (p, d) in done.items()},
        })
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| set | placement | mode | dtype | none s | default s | none / default | median per recording | "
             "decoder none / default | same words | default drafted with | acceptance |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for r in rows:
        decoder = r["none_decode_seconds"] / r["default_decode_seconds"] if r["default_decode_seconds"] else 0.0
        acceptance = "-" if r["acceptance"] is None else f"{r['acceptance']:.1%}"
        lines.append(f"| {r['set']} ({r['recordings']}) | {r['placement']} | {r['mode']} | {r['dtype']} | "
                     f"{r['none_seconds']:.2f} | {r['default_seconds']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['median_speedup']:.2f}x | {decoder:.2f}x | {r['same_words']} | "
                     f"{', '.join(r['assistants'])} | {acceptance} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(figure_path("default-matrix")))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--placements", default="memory,disk", help="memory and/or disk (offloaded decoder layers)")
    parser.add_argument("--sets", default="short,long", help="short (the 65 recordings) and/or long (two files)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N recordings of each set")
    args = parser.parse_args()
    placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not set(placements) <= {"memory", "disk"} or not set(sets) <= {"short", "long"}:
        parser.error("--placements takes memory and disk, --sets short and long")
    use_threads(args.threads)
    found = machine()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for placement in placements:
            for set_name in sets:
                folder = Path(tmp) / f"{placement}-{set_name}"
                folder.mkdir()
                rows += run_cells(set_name, placement, args.limit, folder)
                # Written after every run, so that a run stopped part-way keeps what it measured.
                md = write_figures(args.out, {"rows": rows}, table(rows), command_line(), found)
                print(md.read_text(), flush=True)


if __name__ == "__main__":
    main()
