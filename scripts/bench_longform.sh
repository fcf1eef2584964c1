#!/usr/bin/env bash
# Long-form benchmark (issue 4): the three sonnets joined (158 s) and the VoxPopuli speech (69 s), every
# assistant available here side by side with plain greedy and transformers' own generate(), one interleaved
# `asr eval` run (warm-up, then item by item across configurations).
#
#   scripts/bench_longform.sh [REPORT_DIR] [extra asr eval options]
#
# Environment: EVALDATA (default $ASSISTED_WHISPER_EVALDATA, else ../shared/evaldata), THREADS (default 2),
# CONFIGS (--compare values). The recordings come from scripts/benchlib.py. Writes no figure files: the report
# folder holds asr eval's report (docs/figures/draft-longform.md is a copy of one).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac

cd "$(dirname "$0")/.."
EVALDATA=${EVALDATA:-${ASSISTED_WHISPER_EVALDATA:-../shared/evaldata}}
ASSISTED_WHISPER_EVALDATA=$(cd "$EVALDATA" && pwd)
export ASSISTED_WHISPER_EVALDATA
THREADS=${THREADS:-2}
REPORT=${1:-reports/longform-$(date +%Y%m%d-%H%M)}
shift || true
CONFIGS=${CONFIGS:-"greedy auto assisted:self:int8 assisted:self:bf16 assisted:tiny.en transformers transformers-assisted:tiny.en faster-whisper"}

mkdir -p "$REPORT"
PYTHONPATH=scripts python - "$REPORT" <<'PY'
import json, sys
from pathlib import Path

import soundfile as sf

from benchlib import EVALDATA, SAMPLE_RATE, VOXPOPULI, longform_rows, sonnets, sonnets_reference

report = Path(sys.argv[1])
sf.write(report / "sonnets.wav", sonnets(), SAMPLE_RATE, subtype="FLOAT")
items = [
    {"id": "sonnets", "audio": str((report / "sonnets.wav").resolve()), "language": "en", "subset": "longform",
     "text": sonnets_reference()},
    {"id": "voxpopuli", "audio": str(EVALDATA / "longform" / VOXPOPULI), "language": "en", "subset": "longform",
     "text": longform_rows()[VOXPOPULI]["text"]},
]
(report / "longform.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
PY

compare=()
for config in $CONFIGS; do
  case "$config" in auto) compare+=(--compare "assisted:auto") ;; *) compare+=(--compare "$config") ;; esac
done
asr eval "$REPORT/longform.jsonl" --model base --threads "$THREADS" "${compare[@]}" --report "$REPORT" "$@"
