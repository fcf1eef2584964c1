"""What a model can be asked: the spoken language (named, checked or detected) and the task."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode
from audio import N_SAMPLES, log_mel
from audio.features import margins

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.models.tokenizer import SpecialTokens

logger = logging.getLogger(__name__)


def language_code(code: str) -> str:
    """A language code or name ("de", "German") as Whisper's code; no model needed, so that the command line
    refuses an unknown language before it loads one.

    Raises:
        ValueError: a language Whisper does not know.
    """
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    key = _language_key(code)
    if key not in LANGUAGES:
        raise ValueError(f"unknown language {code!r}; use a code such as {', '.join(list(LANGUAGES)[:8])}, ... "
                         "or a name such as German")
    return key


def _language_key(code: str) -> str:
    """"German", " DE " -> "de": a name as its code, a code as it is (lower case); not checked."""
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    key = code.strip().lower()
    return TO_LANGUAGE_CODE.get(key, key)


def resolve_language(code: str | None, bundle: WhisperBundle) -> str | None:
    """Turns a language code or name ("de", "German") into a code the model knows.

    Raises:
        ValueError: an unknown language, or any language but English for an English-only model.
    """
    if code is None:
        return None if bundle.is_multilingual else "en"
    key = _language_key(code)
    known = bundle.special.languages
    if not bundle.is_multilingual:
        if key != "en":
            raise ValueError(f"model {bundle.name} is English-only; it cannot transcribe language {code!r}")
        return "en"
    if key not in known:
        raise ValueError(f"unknown language {code!r}; use a code such as {', '.join(list(known)[:8])}, ...")
    return key


def check_task(task: str, bundle: WhisperBundle) -> None:
    """Raises ValueError when `bundle`'s model cannot do `task` (English-only models cannot translate)."""
    if task == "translate" and not bundle.is_multilingual:
        raise ValueError(f"model {bundle.name} is English-only; it cannot translate")


@torch.inference_mode()
def detect_languages(decoder: WhisperDecoderAdapter, special: SpecialTokens) -> list[tuple[str, dict[str, float]]]:
    """Whisper's language detection: the decoder's distribution over language tokens after <|startoftranscript|>.

    Args:
        decoder: the model's decoder over the windows to classify.
        special: the model's special tokens (start of transcript, language ids).

    Returns:
        Per window: (the most likely language code, probability of every language code).
    """
    language_ids = special.languages
    ids = torch.full((decoder.batch_size, 1), special.sot, dtype=torch.long, device=decoder.device)
    logits = decoder.forward(ids, decoder.new_cache(decoder.batch_size), 1)[:, -1]
    codes = list(language_ids)
    index = torch.tensor([language_ids[c] for c in codes], device=logits.device)
    out = []
    for probs in logits[:, index].softmax(-1).tolist():
        ranked = dict(zip(codes, probs))
        out.append((max(ranked, key=ranked.get), ranked))
    return out


def detect_language(bundle: WhisperBundle, samples: np.ndarray, segments: int = 1, threshold: float = 0.5,
                    floor: float | None = None) -> tuple[str, dict[str, float]]:
    """The language of the first `segments` 30 s windows of `samples`, and each language code's probability
    (`floor`: the features' floor of the recording they are cut from, `audio.recording_floor`).

    The windows are classified one at a time: the first whose most likely language is above `threshold` decides;
    otherwise the probabilities are averaged over the windows and the most likely language wins.

    Raises:
        ValueError: an English-only model (it has no language tokens).
    """
    if not bundle.is_multilingual:
        raise ValueError(f"model {bundle.name} is English-only; it has no languages to detect")
    starts = range(0, max(len(samples), 1), N_SAMPLES)
    seen: list[dict[str, float]] = []
    for start in list(starts)[:segments]:
        end = min(start + N_SAMPLES, len(samples))
        features = log_mel([samples[start:end]], bundle.n_mels, floors=[floor], pad_with_silence=True,
                           around=[margins(samples, start, end)])
        decoder = WhisperDecoderAdapter(bundle.model, encode(bundle.model, features))
        (language, probs), = detect_languages(decoder, bundle.special)
        if probs[language] > threshold:
            seen = [probs]
            break
        seen.append(probs)
    average = {code: sum(p[code] for p in seen) / len(seen) for code in seen[0]}
    language = max(average, key=average.get)
    logger.info("detected language %s (p=%.2f) over %d window(s)", language, average[language], len(seen))
    return language, average
