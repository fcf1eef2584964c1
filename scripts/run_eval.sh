#!/usr/bin/env bash
# The README's results table: every configuration available here over the English recordings of
# ../shared/evaldata that are fit for WER (short clips and long-form), one interleaved run; FOLDERS and LANGUAGE
# choose other recordings (FOLDERS=fleurs LANGUAGE=all: the 50 FLEURS clips, each in its own language).
#
#   scripts/run_eval.sh [REPORT_DIR] [extra asr eval options, e.g. --limit 10]
#
# Environment: EVALDATA (default $ASSISTED_WHISPER_EVALDATA, else ../shared/evaldata), MODEL (default base),
# THREADS (default 2), CONFIGS (space-separated --compare values; default below), FOLDERS (space-separated
# evaldata folders; default the English WER set's), LANGUAGE (a language code, or all; default en). faster-whisper is skipped
# when not installed. The manifest comes from scripts/benchlib.py (wer_items). Writes no figure files: the
# report folder holds asr eval's report.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac

cd "$(dirname "$0")/.."
EVALDATA=${EVALDATA:-${ASSISTED_WHISPER_EVALDATA:-../shared/evaldata}}
ASSISTED_WHISPER_EVALDATA=$(cd "$EVALDATA" && pwd)
export ASSISTED_WHISPER_EVALDATA
MODEL=${MODEL:-base}
THREADS=${THREADS:-2}
REPORT=${1:-reports/eval-$(date +%Y%m%d-%H%M)}
shift || true
CONFIGS=${CONFIGS:-"greedy assisted:self:int8 assisted:self:bf16 assisted:tiny.en transformers transformers-assisted:tiny.en faster-whisper faster-whisper,compute_type=int8"}

FOLDERS=${FOLDERS:-"librispeech ljspeech fleurs clips spontaneous longform"}
LANGUAGE=${LANGUAGE:-en}

mkdir -p "$REPORT"
MANIFEST="$REPORT/$([ "$LANGUAGE" = en ] && echo english || echo "$LANGUAGE").jsonl"
# One manifest of the WER items, with absolute paths and the folder as subset.
PYTHONPATH=scripts python - "$MANIFEST" "$LANGUAGE" $FOLDERS <<'EOF'
import json, sys
from pathlib import Path

from benchlib import wer_items

out, language, folders = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = [{k: item[k] for k in ("id", "audio", "text", "language", "subset")}
        for item in wer_items(folders, language=None if language == "all" else language, skip_missing=True)]
out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
print(f"run_eval: {len(rows)} items in {out}", file=sys.stderr)
EOF

compare=()
for config in $CONFIGS; do compare+=(--compare "$config"); done
asr eval "$MANIFEST" --model "$MODEL" --threads "$THREADS" "${compare[@]}" --report "$REPORT" "$@"
