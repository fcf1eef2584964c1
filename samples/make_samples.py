"""Regenerate the bundled sample clips and their manifest with espeak-ng (synthetic speech).

Needs the ``espeak-ng`` command (``apt-get install espeak-ng``) and the project's Python environment;
only to regenerate, never at test time. Run from anywhere::

    python samples/make_samples.py

Each clip is espeak-ng's 22.05 kHz output with 0.25 s of silence added before and after, resampled to
16 kHz with soxr (``soxr_hq``, as ``audio.load_audio`` does) and written as 16-bit mono FLAC.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import librosa
import numpy as np
import soundfile as sf

HERE = Path(__file__).resolve().parent
SAMPLE_RATE = 16000
VOICE = "en-us"
WORDS_PER_MINUTE = 140
PADDING_S = 0.25  # silence either side, so no word starts at the window's first frame

# (file name, text): short, clear sentences, chosen when Whisper base transcribed them exactly in this voice
# (since features follow openai-whisper's, base hears "$1" for "nine dollars": samples/README.md). espeak-ng's "jumps" in "The quick
# brown fox jumps over the lazy dog." comes out as "jump" at every rate tried, so that pangram is not used.
CLIPS = (
    ("park.flac", "The sun was shining and the children were playing in the park."),
    ("numbers.flac", "She bought twenty three apples and seven oranges for nine dollars."),
    ("station.flac", "We walked to the station and waited for the last train home."),
)


def synthesise(text: str) -> np.ndarray:
    """espeak-ng's rendering of ``text`` as float32 mono samples at SAMPLE_RATE, padded with silence."""
    wav = subprocess.run(
        ["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
        capture_output=True, check=True,
    ).stdout
    speech, rate = sf.read(io.BytesIO(wav), dtype="float32")
    speech = librosa.resample(speech, orig_sr=rate, target_sr=SAMPLE_RATE, res_type="soxr_hq")
    pad = np.zeros(round(PADDING_S * SAMPLE_RATE), dtype=np.float32)
    return np.concatenate([pad, speech, pad])


def main() -> int:
    if shutil.which("espeak-ng") is None:
        print("espeak-ng not found: apt-get install espeak-ng", file=sys.stderr)
        return 1
    lines = []
    for name, text in CLIPS:
        audio = synthesise(text)
        sf.write(HERE / name, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        duration = round(sf.info(HERE / name).duration, 3)
        lines.append({"audio": name, "text": text, "language": "en", "duration_s": duration,
                      "source": f"espeak-ng -v {VOICE} -s {WORDS_PER_MINUTE} (synthetic)"})
        print(f"{name}: {duration:.3f} s, {(HERE / name).stat().st_size} bytes")
    with open(HERE / "manifest.jsonl", "w", encoding="utf-8") as manifest:
        manifest.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
