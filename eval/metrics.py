"""From measured runs to figures: WER per configuration and subset, latency, speed-up and exactness."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Sequence

from eval.backends.decoded import Decoded
from eval.normalize import normalize, normalizer_name
from eval.runner import EvalItem, EvalRun, Failure
from eval.wer import ErrorCounts, error_counts

NO_SUBSET = "(none)"

# What the figures mean; report.md prints this.
DEFINITIONS = """\
- WER: (S + D + I) / N over all items with a reference, after one normaliser on both sides
  (`eval.normalize`); characters instead of words for zh/ja/ko and other languages written without spaces.
- RTF: processing time / audio time (lower is faster). Speed-up (total time): the reference (first)
  configuration's total time over this one's, on the items both decoded; long items weigh most. Median per-item
  speed-up: the median over those items of each item's own ratio, so a short clip weighs as much as a long
  recording (gains on long recordings move the first and barely the second). Exactness: share of those items
  whose text equals the reference configuration's.
- Tokens per second: generated tokens / decoder time. Passes per token: model forward passes / generated
  tokens (end-of-text included), counting each window's prompt pass and the passes of temperature-fallback
  attempts: plain greedy is 1 plus one pass per window attempt (about 1.03 for windows of 33 tokens); below 1
  when drafts are accepted. Acceptance rate: accepted / drafted tokens. Mean accepted length: tokens added per
  verification round (accepted drafts plus the model's own token).
- `-`: not measured. transformers' generate reports no drafts or acceptance (its passes are counted with
  hooks); faster-whisper reports no time split and no passes.
"""


def item_language(item: EvalItem, decoded: Decoded | None) -> str:
    """The language an item is scored in: its own, else the one detected, else English."""
    return item.language or (decoded.language if decoded is not None else None) or "en"


def item_row(item: EvalItem, outcome: Decoded | Failure | None, reference: Decoded | Failure | None) -> dict[str, Any]:
    """One row of items.jsonl: an item as one configuration decoded it, compared with the first configuration."""
    row: dict[str, Any] = {"id": item.id, "audio": item.display, "subset": item.subset,
                           "audio_seconds": round(item.audio_seconds, 3), "reference": item.reference,
                           "hypothesis": None, "reference_normalized": None, "hypothesis_normalized": None,
                           "wer": None, "seconds": None, "rtf": None, "item_error": item.error}
    if not isinstance(outcome, Decoded):
        row["error"] = outcome.message if isinstance(outcome, Failure) else item.error
        return row
    language = item_language(item, outcome)
    row.update(language=language, normalizer=normalizer_name(language), hypothesis=outcome.text, error=None)
    if item.reference is not None:
        row["reference_normalized"] = normalize(item.reference, language)
        row["hypothesis_normalized"] = normalize(outcome.text, language)
        counts = error_counts([row["reference_normalized"]], [row["hypothesis_normalized"]], language,
                              normalized=True)
        row.update(substitutions=counts.substitutions, deletions=counts.deletions, insertions=counts.insertions,
                   reference_length=counts.reference_length,
                   wer=_round(counts.rate) if counts.reference_length else None)
    else:
        row.update(reference_normalized=None, hypothesis_normalized=normalize(outcome.text, language), wer=None)
    row.update(
        seconds=round(outcome.seconds, 4), rtf=_round(_ratio(outcome.seconds, item.audio_seconds)),
        encode_seconds=_round(outcome.encode_seconds), decode_seconds=_round(outcome.decode_seconds),
        generated_tokens=outcome.generated_tokens,
        tokens_per_second=_round(_ratio(outcome.generated_tokens, outcome.decode_seconds)),
        model_forward_passes=outcome.model_forward_passes,
        forward_passes_per_token=_round(_ratio(outcome.model_forward_passes, outcome.generated_tokens)),
        assistant_forward_passes=outcome.assistant_forward_passes,
        drafted_tokens=outcome.drafted_tokens, accepted_tokens=outcome.accepted_tokens,
        acceptance_rate=_round(_ratio(outcome.accepted_tokens, outcome.drafted_tokens)),
        assistant=outcome.assistant, rounds=outcome.rounds, mean_accepted_length=_round(_ratio(outcome.generated_tokens, outcome.rounds)),
        accepted_length_histogram=None if outcome.accepted_length_histogram is None
        else {str(k): v for k, v in sorted(outcome.accepted_length_histogram.items())},
    )
    if isinstance(reference, Decoded):
        row["same_text_as_first"] = outcome.text.strip() == reference.text.strip()
        row["speedup"] = _round(_ratio(reference.seconds, outcome.seconds))
    return row


def summarize(run: EvalRun) -> dict[str, Any]:
    """The whole report as one JSON-ready dictionary (see report.json)."""
    first = run.configs[0].name if run.configs else None
    configurations = []
    for config in run.configs:
        outcomes = run.results[config.name]
        rows = [item_row(item, outcome, run.results[first][i])
                for i, (item, outcome) in enumerate(zip(run.items, outcomes))]
        summary = summarize_config(run.items, outcomes, run.results[first], rows)
        if config.kind == "hypotheses" or run.configs[0].kind == "hypotheses":
            _untimed(summary, rows, stored=config.kind == "hypotheses")
        if run.batch_size > 1:  # items decoded together: only the configuration's whole time means something
            summary.update(dict.fromkeys(("median_seconds", "median_rtf", "median_item_speedup")))
            for row in rows:
                row.update(dict.fromkeys(("seconds", "rtf", "speedup")))
        configurations.append({"name": config.name, "kind": config.kind, "assistant": config.assistant,
                               "reference_configuration": first, **summary, "items": rows})
    for config in configurations:
        config.update(_difference(configurations[0], config))
    missing = [item.id for item in run.items if item.error is None and item.reference is None]
    return {
        "reference_configuration": first,
        "batch_size": run.batch_size,
        "warmup_item": run.warmup_item,
        "items_total": len(run.items),
        "items_decodable": sum(item.error is None for item in run.items),
        "audio_seconds": round(sum(item.audio_seconds for item in run.items), 3),
        "configurations": configurations,
        "skipped_configurations": [{"name": n, "reason": r} for n, r in run.skipped.items()],
        "problems": [{"id": item.id, "audio": item.display, "error": item.error}
                     for item in run.items if item.error is not None],
        "missing_references": missing,
    }


def summarize_config(items: Sequence[EvalItem], outcomes: Sequence[Decoded | Failure | None],
                     first: Sequence[Decoded | Failure | None], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """WER, latency, speed-up and exactness of one configuration over all items."""
    decoded = [(item, o, f, row) for item, o, f, row in zip(items, outcomes, first, rows) if isinstance(o, Decoded)]
    done = [o for _, o, _, _ in decoded]
    total = ErrorCounts()
    subsets: dict[str, ErrorCounts] = {}
    subset_items: Counter = Counter()
    for item, outcome, _, row in decoded:
        if item.reference is None:
            continue
        counts = ErrorCounts(row["substitutions"], row["deletions"], row["insertions"], row["reference_length"])
        total = total + counts
        key = item.subset or NO_SUBSET
        subsets[key] = subsets.get(key, ErrorCounts()) + counts
        subset_items[key] += 1
    seconds = [o.seconds for o in done]
    audio = sum(item.audio_seconds for item, _, _, _ in decoded)
    # Speed-up and exactness only on items both this and the first configuration decoded.
    both = [(o, f) for _, o, f, _ in decoded if isinstance(f, Decoded)]
    histogram: Counter = Counter()
    for _, outcome, _, _ in decoded:
        histogram.update(outcome.accepted_length_histogram or {})
    has_histogram = any(o.accepted_length_histogram is not None for o in done)
    return {
        "items_decoded": len(decoded),
        "items_failed": [{"id": item.id, "error": o.message} for item, o in zip(items, outcomes)
                         if isinstance(o, Failure)],
        "items_scored": sum(subset_items.values()),
        "wer": _round(total.rate) if total.reference_length else None,
        "substitutions": total.substitutions, "deletions": total.deletions, "insertions": total.insertions,
        "reference_length": total.reference_length,
        "subsets": {name: {"wer": _round(c.rate) if c.reference_length else None, "substitutions": c.substitutions,
                           "deletions": c.deletions, "insertions": c.insertions,
                           "reference_length": c.reference_length, "items": subset_items[name]}
                    for name, c in sorted(subsets.items())},
        "total_seconds": round(sum(seconds), 4),
        "audio_seconds": round(audio, 3),
        "median_seconds": _round(_median(seconds)),
        "median_rtf": _round(_median([o.seconds / i.audio_seconds for i, o, _, _ in decoded if i.audio_seconds])),
        "rtf": _round(_ratio(sum(seconds), audio)),
        "rtfx": _round(_ratio(audio, sum(seconds)), 2),
        "encode_seconds": _round(_total(o.encode_seconds for o in done)),
        "decode_seconds": _round(_total(o.decode_seconds for o in done)),
        "median_encode_seconds": _round(_median([o.encode_seconds for o in done
                                                 if o.encode_seconds is not None])),
        "median_decode_seconds": _round(_median([o.decode_seconds for o in done
                                                 if o.decode_seconds is not None])),
        "generated_tokens": _total(o.generated_tokens for o in done),
        "tokens_per_second": _round(_ratio(_total(o.generated_tokens for o in done if o.decode_seconds),
                                           _total(o.decode_seconds for o in done))),
        "model_forward_passes": _total(o.model_forward_passes for o in done),
        "forward_passes_per_token": _round(_ratio(
            _total(o.model_forward_passes for o in done),
            _total(o.generated_tokens for o in done if o.model_forward_passes is not None))),
        "assistant_forward_passes": _total(o.assistant_forward_passes for o in done),
        "acceptance_rate": _round(_ratio(_total(o.accepted_tokens for o in done),
                                         _total(o.drafted_tokens for o in done))),
        "mean_accepted_length": _round(_ratio(
            _total(o.generated_tokens for o in done if o.rounds is not None),
            _total(o.rounds for o in done))),
        "accepted_length_histogram": {str(k): v for k, v in sorted(histogram.items())} if has_histogram else None,
        "speedup": _round(_ratio(sum(f.seconds for _, f in both), sum(o.seconds for o, _ in both))),
        "median_item_speedup": _round(_median([f.seconds / o.seconds for o, f in both if o.seconds > 0])),
        "compared_items": len(both),
        "exact_matches": sum(o.text.strip() == f.text.strip() for o, f in both),
        "exact_match_rate": _round(_ratio(sum(o.text.strip() == f.text.strip() for o, f in both), len(both))),
    }


# Timing figures that mean nothing for stored transcripts (they were made elsewhere, at another time).
TIMED_KEYS = ("total_seconds", "median_seconds", "median_rtf", "rtf", "speedup", "median_item_speedup")


def _untimed(summary: dict[str, Any], rows: list[dict[str, Any]], stored: bool) -> None:
    """Stored transcripts have no time; nor has a speed-up against them."""
    keys = TIMED_KEYS if stored else ("speedup", "median_item_speedup")
    summary.update(dict.fromkeys(keys))
    for row in rows:
        row.update(dict.fromkeys(("seconds", "rtf", "speedup") if stored else ("speedup",)))


def _difference(first: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """This configuration's WER minus the first's over the items both scored, with its paired bootstrap 95 %
    interval (`eval.bootstrap`)."""
    from eval.bootstrap import paired_interval

    if config is first:
        return {"wer_difference": None, "wer_difference_ci": None, "paired_items": None}
    theirs = {row["id"]: row for row in first["items"] if row.get("wer") is not None}
    pairs = [(theirs[row["id"]], row) for row in config["items"]
             if row.get("wer") is not None and row["id"] in theirs]
    words = [a["reference_length"] for a, _ in pairs]
    errors_a = [a["substitutions"] + a["deletions"] + a["insertions"] for a, _ in pairs]
    errors_b = [b["substitutions"] + b["deletions"] + b["insertions"] for _, b in pairs]
    if not pairs or not sum(words):
        return {"wer_difference": None, "wer_difference_ci": None, "paired_items": len(pairs)}
    interval = paired_interval(errors_a, errors_b, words)
    return {"wer_difference": _round((sum(errors_b) - sum(errors_a)) / sum(words)),
            "wer_difference_ci": None if interval is None else [_round(interval[0]), _round(interval[1])],
            "paired_items": len(pairs)}


def _total(values) -> float | int | None:
    """Sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
