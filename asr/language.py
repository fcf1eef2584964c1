"""What a model can be asked: the spoken language (named, checked or detected) and the task."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from asr.decoder import WhisperDecoderAdapter

if TYPE_CHECKING:
    from asr.models.tokenizer import SpecialTokens


def resolve_language(code: str | None, bundle) -> str | None:
    """Turns a language code or name ("de", "German") into a code the model knows.

    Raises:
        ValueError: an unknown language, or any language but English for an English-only model.
    """
    if code is None:
        return None if bundle.is_multilingual else "en"
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    key = code.strip().lower()
    key = TO_LANGUAGE_CODE.get(key, key)
    known = bundle.special.languages
    if not bundle.is_multilingual:
        if key != "en":
            raise ValueError(f"model {bundle.name} is English-only; it cannot transcribe language {code!r}")
        return "en"
    if key not in known:
        raise ValueError(f"unknown language {code!r}; use a code such as {', '.join(list(known)[:8])}, ...")
    return key


def check_task(task: str, bundle) -> None:
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
