#!/usr/bin/env bash
# Long-form benchmark (issue 4): the three sonnets joined (158 s) and the VoxPopuli speech (69 s), every
# assistant available here side by side with plain greedy and transformers' own generate(), one interleaved
# `asr eval` run (warm-up, then item by item across configurations).
#
#   scripts/bench_longform.sh [REPORT_DIR] [extra asr eval options]
#
# Environment: EVALDATA (default ../shared/evaldata), THREADS (default 2), CONFIGS (--compare values).
set -euo pipefail

cd "$(dirname "$0")/.."
EVALDATA=${EVALDATA:-../shared/evaldata}
THREADS=${THREADS:-2}
REPORT=${1:-reports/longform-$(date +%Y%m%d-%H%M)}
shift || true
CONFIGS=${CONFIGS:-"greedy auto assisted:self:int8 assisted:self:bf16 assisted:tiny.en transformers transformers-assisted:tiny.en faster-whisper"}

mkdir -p "$REPORT"
python - "$EVALDATA" "$REPORT" <<'PY'
import json, sys
from pathlib import Path

import numpy as np
import soundfile as sf

from audio import load_audio

root, report = Path(sys.argv[1]).resolve() / "longform", Path(sys.argv[2])
rows = {json.loads(line)["audio"]: json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines()}
sonnets = np.concatenate([load_audio(root / f"p00{i}.mp3") for i in (1, 2, 3)])
sf.write(report / "sonnets.wav", sonnets, 16000, subtype="FLOAT")
items = [
    {"id": "sonnets", "audio": str((report / "sonnets.wav").resolve()), "language": "en", "subset": "longform",
     "text": " ".join(rows[f"p00{i}.mp3"]["text_body"] for i in (1, 2, 3))},
    {"id": "voxpopuli", "audio": str(root / "voxpopuli-en-000.ogg"), "language": "en", "subset": "longform",
     "text": rows["voxpopuli-en-000.ogg"]["text"]},
]
(report / "longform.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
PY

compare=()
for config in $CONFIGS; do
  case "$config" in auto) compare+=(--compare "assisted:auto") ;; *) compare+=(--compare "$config") ;; esac
done
asr eval "$REPORT/longform.jsonl" --model base --threads "$THREADS" "${compare[@]}" --report "$REPORT" "$@"
