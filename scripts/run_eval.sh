#!/usr/bin/env bash
# The README's results table: every configuration available here over the English recordings of
# ../shared/evaldata that are fit for WER (short clips and long-form), one interleaved run.
#
#   scripts/run_eval.sh [REPORT_DIR] [extra asr eval options, e.g. --limit 10]
#
# Environment: EVALDATA (default ../shared/evaldata), MODEL (default base), THREADS (default 2),
# CONFIGS (space-separated --compare values; default below). faster-whisper is skipped when not installed.
set -euo pipefail

cd "$(dirname "$0")/.."
EVALDATA=${EVALDATA:-../shared/evaldata}
MODEL=${MODEL:-base}
THREADS=${THREADS:-2}
REPORT=${1:-reports/eval-$(date +%Y%m%d-%H%M)}
shift || true
CONFIGS=${CONFIGS:-"greedy assisted:self:int8 assisted:self:bf16 assisted:tiny.en transformers transformers-assisted:tiny.en faster-whisper faster-whisper,compute_type=int8"}

mkdir -p "$REPORT"
MANIFEST="$REPORT/english.jsonl"
# One manifest of the English WER items, with absolute paths and the folder as subset.
python - "$EVALDATA" "$MANIFEST" <<'EOF'
import json, sys
from pathlib import Path

root, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
rows = []
for folder in ("librispeech", "ljspeech", "fleurs", "clips", "spontaneous", "longform"):
    manifest = root / folder / "manifest.jsonl"
    if not manifest.is_file():
        print(f"run_eval: {manifest} not found, left out", file=sys.stderr)
        continue
    for line in manifest.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else None
        if row and row.get("language") == "en" and row.get("eval_use") == "wer":
            rows.append({"id": f"{folder}/{row['audio']}", "audio": str(root / folder / row["audio"]),
                         "text": row["text"], "language": "en", "subset": folder})
out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
print(f"run_eval: {len(rows)} items in {out}", file=sys.stderr)
EOF

compare=()
for config in $CONFIGS; do compare+=(--compare "$config"); done
asr eval "$MANIFEST" --model "$MODEL" --threads "$THREADS" "${compare[@]}" --report "$REPORT" "$@"
