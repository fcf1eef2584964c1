"""Whisper's tokenizer, generation config and special tokens, built from a faster-whisper model folder's
``tokenizer.json`` and ``config.json``.

Every special token id is looked up in the tokenizer (English-only models have them all one lower), never
hard-coded; `SpecialTokens.prompt` is the one place a decoder prompt is put together.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken
from transformers import GenerationConfig, WhisperTokenizerFast

from asr.models.ct2 import ModelFileError

logger = logging.getLogger(__name__)

#: Whisper's timestamp tokens: <|0.00|> ... <|30.00|> in 0.02 s steps, ids right after <|notimestamps|>.
N_TIMESTAMPS = 1501

_LANGUAGE_TOKEN = re.compile(r"<\|([a-z]{2,3}(?:[_-][a-z]+)?)\|>")


@dataclass(frozen=True)
class SpecialTokens:
    """Whisper's special token ids, resolved from one model's tokenizer."""

    sot: int  # <|startoftranscript|>, the decoder start token
    eot: int  # <|endoftext|>, also the padding token
    transcribe: int  # <|transcribe|>
    translate: int  # <|translate|>
    no_timestamps: int  # <|notimestamps|>
    no_speech: int  # <|nocaptions|> (v1/v2) or <|nospeech|> (v3)
    prev: int  # <|startofprev|>, starts a text prompt
    timestamp_begin: int  # <|0.00|>; timestamp ids run from here in 0.02 s steps
    languages: dict[str, int]  # code -> id, e.g. {"en": 50259}; empty for English-only models
    suppress_tokens: tuple[int, ...]  # suppressed at every step
    begin_suppress_tokens: tuple[int, ...]  # suppressed at the first sampled position

    def prompt(self, previous: list[int], language: str | None, task: str, timestamps: bool,
               prefix: list[int] | tuple[int, ...] = ()) -> tuple[list[int], int]:
        """The decoder prompt: the previous text after <|startofprev|> (if any), then the start-of-transcript
        sequence (language and task tokens for multilingual models; <|notimestamps|> without timestamps),
        then `prefix`: tokens the output is forced to start with (faster-whisper's prefix, <|0.00|> first
        with timestamps).

        Returns:
            (the prompt, the index of <|startoftranscript|> in it).
        """
        prompt = [self.prev, *previous] if previous else []
        sot_index = len(prompt)
        prompt.append(self.sot)
        if self.languages:
            prompt += [self.languages[language], self.translate if task == "translate" else self.transcribe]
        if not timestamps:
            prompt.append(self.no_timestamps)
        if prefix:
            prompt += ([self.timestamp_begin] if timestamps else []) + list(prefix)
        return prompt, sot_index


def token_id(tokenizer: WhisperTokenizerFast, *tokens: str) -> int:
    for token in tokens:
        found = tokenizer.convert_tokens_to_ids(token)
        if found is not None and tokenizer.convert_ids_to_tokens(found) == token:
            return int(found)
    raise ModelFileError(f"tokenizer has none of {tokens}: not a Whisper tokenizer")


def special_tokens(
    tokenizer: WhisperTokenizerFast, generation_config: GenerationConfig, is_multilingual: bool
) -> SpecialTokens:
    """Resolves the special token ids of one model.

    Args:
        tokenizer: The model's tokenizer.
        generation_config: Its generation config, for the suppress lists and (multilingual) languages.
        is_multilingual: False for English-only models, whose prompt has no language or task token.

    Returns:
        The ids as plain ints.

    Raises:
        ModelFileError: The tokenizer lacks one of Whisper's special tokens.
    """
    no_timestamps = token_id(tokenizer, "<|notimestamps|>")
    lang_to_id = getattr(generation_config, "lang_to_id", None) or {}
    languages = {tok[2:-2]: int(i) for tok, i in lang_to_id.items()} if is_multilingual else {}
    return SpecialTokens(
        sot=token_id(tokenizer, "<|startoftranscript|>"),
        eot=token_id(tokenizer, "<|endoftext|>"),
        transcribe=token_id(tokenizer, "<|transcribe|>"),
        translate=token_id(tokenizer, "<|translate|>"),
        no_timestamps=no_timestamps,
        no_speech=token_id(tokenizer, "<|nospeech|>", "<|nocaptions|>"),
        prev=token_id(tokenizer, "<|startofprev|>"),
        timestamp_begin=no_timestamps + 1,
        languages=languages,
        suppress_tokens=tuple(int(t) for t in generation_config.suppress_tokens or ()),
        begin_suppress_tokens=tuple(int(t) for t in generation_config.begin_suppress_tokens or ()),
    )


def build_tokenizer(tokenizer_json: Path) -> WhisperTokenizerFast:
    """Builds the transformers tokenizer from a faster-whisper ``tokenizer.json``.

    The file's special added tokens become the tokenizer's extra special tokens (transformers' timestamp
    decoding takes the last special id as the one before ``<|0.00|>``), and the 1501 timestamp tokens are
    added after ``<|notimestamps|>``, as in the tokenizers of the Hub's openai/whisper-* repositories.
    """
    from tokenizers import Tokenizer

    try:
        spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        added = spec["added_tokens"]
        specials = [t["content"] for t in sorted(added, key=lambda t: t["id"]) if t.get("special")]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelFileError(f"{tokenizer_json}: not a readable tokenizer.json ({e})") from None
    restored = restore_missing_merges(spec)
    if restored:
        logger.info("%s: restored %d BPE merge(s) missing from the file (%s)", tokenizer_json, len(restored),
                    ", ".join(restored[:3]))
    try:
        tokenizer = WhisperTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                         extra_special_tokens=specials, pad_token="<|endoftext|>")
    except Exception as e:  # the tokenizers library raises its own exception types
        raise ModelFileError(f"{tokenizer_json}: cannot build a tokenizer ({e})") from None
    no_timestamps = token_id(tokenizer, "<|notimestamps|>")
    if len(tokenizer) != no_timestamps + 1:
        raise ModelFileError(f"{tokenizer_json}: {len(tokenizer)} tokens, expected <|notimestamps|> "
                             f"({no_timestamps}) to be the last")
    tokenizer.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False,
                                     special=False) for i in range(N_TIMESTAMPS)])
    return tokenizer


def restore_missing_merges(spec: dict) -> list[str]:
    """Puts back byte-level BPE merges that a tokenizer.json lacks (in place); returns the merges added.

    In a tiktoken-derived vocabulary (GPT-2, Whisper) every token past the 256 single bytes is made by exactly
    one merge, ranked by the token's id. The multilingual `base` package's file lacks the first one, "Ġ t"
    (probably read as a `#version` header line): without it every word starting with " t" encodes as "Ġ" +
    "the..." instead of the token the model emits (" the" -> [220, 3322] instead of [264]). Each missing merge
    is the split of the token that BPE with the remaining merges ends at, inserted at its id's rank.
    """
    model = spec.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list) or not merges:
        return []
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    produced = {a + b for a, b in pairs}
    special = {t["content"] for t in spec.get("added_tokens", [])}
    missing = sorted((i, token) for token, i in vocab.items()
                     if i >= 256 and token not in produced and token not in special and len(token) > 1)
    if not missing:
        return []
    rank = {pair: r for r, pair in enumerate(pairs)}
    restored = []
    for token_id, token in missing:
        pair = _last_merge(token, rank)
        if pair is None or pair[0] not in vocab or pair[1] not in vocab:
            continue
        at = next((r for r, (a, b) in enumerate(pairs) if vocab.get(a + b, -1) > token_id), len(pairs))
        pairs.insert(at, pair)
        rank = {p: r for r, p in enumerate(pairs)}
        restored.append(" ".join(pair))
    as_strings = isinstance(merges[0], str)
    model["merges"] = [" ".join(p) if as_strings else list(p) for p in pairs]
    return restored


def _last_merge(token: str, rank: dict[tuple[str, str], int]) -> tuple[str, str] | None:
    """The two parts byte-level BPE leaves `token` in with the merges ranked in `rank` (None: not two parts)."""
    parts = list(token)
    while len(parts) > 2:
        best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), len(rank)))
        if (parts[best], parts[best + 1]) not in rank:
            return None
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def build_generation_config(
    ct2_config: dict, tokenizer: WhisperTokenizerFast, is_multilingual: bool, decoder_layers: int,
    decoder_heads: int,
) -> GenerationConfig:
    """Builds the complete generation config ``WhisperForConditionalGeneration.generate`` needs.

    Args:
        ct2_config: The faster-whisper ``config.json`` (alignment_heads, suppress_ids, suppress_ids_begin).
        tokenizer: The model's tokenizer (from :func:`build_tokenizer`).
        is_multilingual: Whether the model has language and task tokens.
        decoder_layers: Decoder layer count, for the default alignment heads.
        decoder_heads: Decoder head count, for the default alignment heads.

    Returns:
        The generation config. English-only models get no ``lang_to_id``/``task_to_id``, as on the Hub:
        with them, ``generate`` would detect a language and put its token in the prompt.
    """
    eot = token_id(tokenizer, "<|endoftext|>")
    sot = token_id(tokenizer, "<|startoftranscript|>")
    heads = ct2_config.get("alignment_heads")
    if not heads:  # openai/whisper's default: every head of the second half of the decoder
        heads = [[layer, h] for layer in range(decoder_layers // 2, decoder_layers) for h in range(decoder_heads)]
    extra: dict = {}
    if is_multilingual:
        translate = token_id(tokenizer, "<|translate|>")
        extra["lang_to_id"] = {tok: i for i, tok in sorted(
            (i, tok) for tok, i in tokenizer.get_added_vocab().items() if sot < i < translate
            and _LANGUAGE_TOKEN.fullmatch(tok))}
        extra["task_to_id"] = {"transcribe": token_id(tokenizer, "<|transcribe|>"), "translate": translate}
        listed = ct2_config.get("lang_ids")
        if listed is not None and sorted(listed) != sorted(extra["lang_to_id"].values()):
            logger.warning("config.json lang_ids differ from the tokenizer's language tokens; using the tokenizer")
    return GenerationConfig(
        alignment_heads=[list(map(int, pair)) for pair in heads],
        begin_suppress_tokens=list(ct2_config.get("suppress_ids_begin", [token_id(tokenizer, "Ġ"), eot])),
        bos_token_id=eot,
        decoder_start_token_id=sot,
        eos_token_id=eot,
        forced_decoder_ids=None,
        is_multilingual=is_multilingual,
        max_initial_timestamp_index=50,
        max_length=448,
        no_timestamps_token_id=token_id(tokenizer, "<|notimestamps|>"),
        pad_token_id=eot,
        prev_sot_token_id=token_id(tokenizer, "<|startofprev|>"),
        return_timestamps=False,
        suppress_tokens=list(ct2_config.get("suppress_ids", _control_tokens(tokenizer))),
        **extra,
    )


def _control_tokens(tokenizer: WhisperTokenizerFast) -> list[int]:
    """The tokens openai-whisper never lets the model generate whatever the suppress list says (task, start,
    previous-text and no-speech tokens): the suppress list of a model folder that brings none."""
    tokens = ["<|translate|>", "<|transcribe|>", "<|startoftranscript|>", "<|startoflm|>", "<|startofprev|>",
              "<|nospeech|>", "<|nocaptions|>"]
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    return sorted({int(i) for i, t in zip(ids, tokens) if i is not None and tokenizer.convert_ids_to_tokens(i) == t})
