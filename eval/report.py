"""Writes an evaluation's report folder: report.md, report.json, items.jsonl and the plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.metrics import DEFINITIONS

REPORT_FILES = ("report.md", "report.json", "items.jsonl")


def write_report(report: dict[str, Any], folder: str | Path) -> list[Path]:
    """Writes the report files into `folder` (created if needed), replacing earlier ones.

    Args:
        report: `eval.metrics.summarize`'s dictionary, with a `run` entry describing the run (model, device...).

    Returns:
        The files written.
    """
    from eval.plots import write_plots

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plots = write_plots(report, folder)
    report = dict(report, plots=[p.name for p in plots])
    (folder / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    with open(folder / "items.jsonl", "w", encoding="utf-8") as handle:
        for config in report["configurations"]:
            for row in config["items"]:
                handle.write(json.dumps({"configuration": config["name"], **row}, ensure_ascii=False) + "\n")
    (folder / "report.md").write_text(markdown(report), encoding="utf-8")
    return [folder / name for name in REPORT_FILES] + plots


def markdown(report: dict[str, Any]) -> str:
    """The tables a person reads."""
    run = report.get("run", {})
    configs = report["configurations"]
    lines = ["# Evaluation report", ""]
    if run:
        lines += [f"- model: `{run.get('model')}` on {run.get('device')} ({run.get('dtype')}, "
                  f"{run.get('threads')} threads); {run.get('date', '')}",
                  f"- sources: {', '.join(f'`{s}`' for s in run.get('sources', []))}"]
        if run.get("command"):
            lines.append(f"- command: `{run['command']}`")
    lines += [f"- items: {report['items_decodable']} decodable of {report['items_total']}, "
              f"{report['audio_seconds']:.1f} s of audio; warm-up on `{report['warmup_item']}` (not counted)",
              f"- reference configuration (speed-up, exactness): `{report['reference_configuration']}`"]
    if report.get("batch_size", 1) > 1:
        lines.append(f"- batched: {report['batch_size']} items decoded together by this library's configurations; "
                     "each configuration is timed as a whole (total s, RTF), so per-item times are not shown")
    lines += [""]

    lines += ["## Accuracy and speed", "",
              _table(["configuration", "WER", "WER - reference's (95 % CI)", "S / D / I", "median RTF", "RTF",
                      "total s", "speed-up (total time)", "exact", "items"],
                     [[f"`{c['name']}`", _pct(c["wer"]), _difference(c),
                       f"{c['substitutions']} / {c['deletions']} / {c['insertions']}",
                       _num(c["median_rtf"], 3), _num(c["rtf"], 3), _num(c["total_seconds"], 2),
                       _times(c["speedup"]), _pct(c["exact_match_rate"], 0),
                       f"{c['items_decoded']}" + (f" ({len(c['items_failed'])} failed)" if c["items_failed"] else "")]
                      for c in configs]), "",
              f"Speed-up (total time): `{report['reference_configuration']}`'s total seconds over this "
              "configuration's. Exact: items whose text is the reference configuration's. WER - reference's: on "
              "the items both scored, with a paired bootstrap 95 % interval (1,000 resamples of the items); an "
              "interval that holds 0 is a difference the choice of items alone could make. Normalisers: "
              f"{_normalizers(configs)}.", ""]
    lines += ["## Where the time goes", "",
              _table(["configuration", "encoder s", "decoder s", "median item s", "median per-item speed-up", "tokens",
                      "tokens/s", "passes/token", "acceptance", "mean accepted"],
                     [[f"`{c['name']}`", _num(c["encode_seconds"], 2), _num(c["decode_seconds"], 2),
                       _num(c["median_seconds"], 3), _times(c["median_item_speedup"]), _num(c["generated_tokens"], 0),
                       _num(c["tokens_per_second"], 1), _num(c["forward_passes_per_token"], 3),
                       _pct(c["acceptance_rate"], 1), _num(c["mean_accepted_length"], 2)] for c in configs]), "",
              "Median per-item speed-up: the median of each item's own speed-up, so short clips weigh as much as long "
              "recordings. Passes/token: model passes over generated tokens, each window's prompt pass included "
              "(plain greedy is a little above 1).", ""]
    subsets = sorted({s for c in configs for s in c["subsets"]})
    if subsets:
        lines += ["## WER per subset", "",
                  _table(["subset", "items", "words"] + [f"`{c['name']}`" for c in configs],
                         [[s, str(configs[0]["subsets"].get(s, {}).get("items", "-")),
                           str(configs[0]["subsets"].get(s, {}).get("reference_length", "-"))]
                          + [_pct(c["subsets"].get(s, {}).get("wer")) for c in configs] for s in subsets]), ""]
    if report.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]] + [""]
    lines += _problems(report)
    lines += ["## Definitions", "", DEFINITIONS.strip(), ""]
    return "\n".join(lines)


def _problems(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for skipped in report["skipped_configurations"]:
        lines.append(f"- configuration `{skipped['name']}` skipped: {skipped['reason']}")
    for problem in report["problems"]:
        lines.append(f"- item `{problem['id']}` not decoded: {problem['error']}")
    if report["missing_references"]:
        ids = report["missing_references"]
        shown = ", ".join(f"`{i}`" for i in ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        lines.append(f"- {len(ids)} item(s) without reference text (latency only): {shown}")
    for source in report.get("hypotheses", []):
        lines += [f"- hypotheses `{source['name']}` ({source['path']}): {source['rows']} row(s), {source['matched']} "
                  f"matched, {len(source['missing_items'])} item(s) without one, {len(source['unmatched_ids'])} "
                  f"id(s) matching no item, {len(source['duplicate_ids'])} repeated, {len(source['empty_texts'])} "
                  f"empty, {len(source['unreadable_rows'])} unreadable"]
    for config in report["configurations"]:
        for failed in config["items_failed"]:
            lines.append(f"- `{config['name']}` failed on `{failed['id']}`: {failed['error']}")
    return ["## Problems", ""] + lines + [""] if lines else []


def _difference(config: dict[str, Any]) -> str:
    if config.get("wer_difference") is None:
        return "-"
    low, high = config.get("wer_difference_ci") or (None, None)
    interval = "" if low is None else f" ({100 * low:+.2f} to {100 * high:+.2f})"
    return f"{100 * config['wer_difference']:+.2f}{interval}"


def _normalizers(configs: list[dict[str, Any]]) -> str:
    names = sorted({row["normalizer"] for c in configs for row in c["items"] if row.get("normalizer")})
    return "; ".join(names) or "-"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f} %"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
