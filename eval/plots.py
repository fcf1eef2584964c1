"""The report's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOTS = ("latency.png", "speedup_vs_length.png", "accepted_lengths.png", "wer_by_subset.png")


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    """Draws every plot into `folder`; a plot without data says so instead of being left out.

    Returns:
        The PNG files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configurations"]
    written = []
    for name, draw in zip(PLOTS, (_latency, _speedup_vs_length, _accepted_lengths, _wer_by_subset)):
        figure, axes = plt.subplots(figsize=(8, 4.5), layout="constrained")
        if not draw(axes, configs, report):
            axes.set_axis_off()
            axes.text(0.5, 0.5, "no data for this plot", ha="center", va="center", transform=axes.transAxes)
        figure.savefig(folder / name, dpi=110)
        plt.close(figure)
        written.append(folder / name)
    return written


def _latency(axes, configs: list[dict], report: dict) -> bool:
    """Per-item wall time of each configuration (box) with every item (dots)."""
    data = [[row["seconds"] for row in c["items"] if row.get("seconds") is not None] for c in configs]
    if not any(data):
        return False
    labels = [c["name"] for c in configs]
    axes.boxplot([d or [float("nan")] for d in data], showfliers=False)
    for position, values in enumerate(data, start=1):
        axes.plot([position] * len(values), values, "o", alpha=0.5, markersize=4)
    axes.set_xticks(range(1, len(labels) + 1), labels, rotation=15, ha="right")
    axes.set_ylabel("seconds per item")
    axes.set_title("Latency per configuration")
    axes.grid(axis="y", alpha=0.3)
    return True


def _speedup_vs_length(axes, configs: list[dict], report: dict) -> bool:
    """Speed-up of each configuration over the first, per item, against the item's audio length."""
    drawn = False
    for config in configs[1:]:
        points = [(row["audio_seconds"], row["speedup"]) for row in config["items"] if row.get("speedup")]
        if points:
            axes.scatter(*zip(*points), label=config["name"], alpha=0.7, s=18)
            drawn = True
    if not drawn:
        return False
    axes.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    axes.set_xlabel("audio length (s)")
    axes.set_ylabel(f"speed-up over {configs[0]['name']}")
    axes.set_title("Speed-up against audio length")
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    return True


def _accepted_lengths(axes, configs: list[dict], report: dict) -> bool:
    """Share of verification rounds that accepted 0, 1, 2... drafts, per assisted configuration."""
    histograms = [(c["name"], {int(k): v for k, v in c["accepted_length_histogram"].items()})
                  for c in configs if c.get("accepted_length_histogram")]
    if not histograms:
        return False
    top = max(max(h) for _, h in histograms)
    width = 0.8 / len(histograms)
    for index, (name, histogram) in enumerate(histograms):
        rounds = sum(histogram.values())
        xs = [x + (index - (len(histograms) - 1) / 2) * width for x in range(top + 1)]
        axes.bar(xs, [histogram.get(x, 0) / rounds for x in range(top + 1)], width=width, label=name)
    axes.set_xticks(range(top + 1))
    axes.set_xlabel("drafts accepted in a round")
    axes.set_ylabel("share of rounds")
    axes.set_title("Accepted lengths")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    return True


def _wer_by_subset(axes, configs: list[dict], report: dict) -> bool:
    """WER of each configuration in each subset."""
    subsets = sorted({s for c in configs for s, v in c["subsets"].items() if v["wer"] is not None})
    if not subsets:
        return False
    width = 0.8 / len(configs)
    highest = 0.0
    for index, config in enumerate(configs):
        xs = [x + (index - (len(configs) - 1) / 2) * width for x in range(len(subsets))]
        values = [100 * (config["subsets"].get(s, {}).get("wer") or 0.0) for s in subsets]
        bars = axes.bar(xs, values, width=width, label=config["name"])
        axes.bar_label(bars, fmt="%.1f", fontsize="x-small")
        highest = max(highest, *values)
    axes.set_ylim(0, max(highest, 1.0) * 1.2)  # all-zero WER still gets an upright axis
    axes.set_xticks(range(len(subsets)), subsets, rotation=15, ha="right")
    axes.set_ylabel("WER (%)")
    axes.set_title("WER per subset")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    return True
