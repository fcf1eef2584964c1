"""Convert a CTranslate2 (faster-whisper) Whisper model into a transformers model folder.

CTranslate2 variable names map onto transformers' parameter names (`_plain_names`, `_fused_names`); the
tokenizer and generation config come from `asr.models.tokenizer`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)

from asr.models.ct2 import Ct2File, ModelFileError, read_ct2
from asr.models.tokenizer import build_generation_config, build_tokenizer

logger = logging.getLogger(__name__)

#: Bumped whenever the output of :func:`convert_ct2` changes, so cached conversions are rebuilt.
CONVERTER_VERSION = 2


# CTranslate2 spec flags and the value a Whisper model must have (activation 3 is GELU).
_EXPECTED_FLAGS = {"decoder/activation": 3, "decoder/alibi": 0, "decoder/pre_norm": 1,
                   "decoder/scale_embeddings": 0, "decoder/start_from_zero_embedding": 0}
def _scalar(ct2: Ct2File, name: str) -> int:
    value = ct2.variables.get(name)
    if value is None or value.numel() != 1 or value.is_floating_point():
        raise ModelFileError(f"{ct2.path}: missing or malformed integer {name!r}")
    return int(value.item())


def _float(ct2: Ct2File, name: str) -> torch.Tensor:
    """A weight as float32; int8 weights with a ``<name>_scale`` row scale are dequantised."""
    value = ct2.variables[name]
    if value.dtype == torch.int8:
        scale = ct2.variables.get(f"{name}_scale")
        if scale is None or value.dim() != 2 or scale.shape != (value.shape[0],):
            raise ModelFileError(f"{ct2.path}: int8 {name!r} without a matching {name}_scale")
        return value.float() / scale.float().unsqueeze(1)  # CTranslate2 stores q = round(w * scale)
    if not value.is_floating_point():
        raise ModelFileError(f"{ct2.path}: {name!r} has dtype {value.dtype}, expected a float or int8 weight")
    return value.float()


def _norm(src: str, dst: str) -> list[tuple[str, str]]:
    return [(src + "gamma", dst + "weight"), (src + "beta", dst + "bias")]


def _linear(src: str, dst: str) -> list[tuple[str, str]]:
    return [(src + "weight", dst + "weight"), (src + "bias", dst + "bias")]


def _plain_names(encoder_layers: int, decoder_layers: int) -> list[tuple[str, str]]:
    """(CTranslate2 name, transformers name) of every weight that maps one to one."""
    names = [*_linear("encoder/conv1/", "model.encoder.conv1."), *_linear("encoder/conv2/", "model.encoder.conv2."),
             ("encoder/position_encodings/encodings", "model.encoder.embed_positions.weight"),
             ("decoder/position_encodings/encodings", "model.decoder.embed_positions.weight"),
             ("decoder/embeddings/weight", "model.decoder.embed_tokens.weight"),
             *_norm("encoder/layer_norm/", "model.encoder.layer_norm."),
             *_norm("decoder/layer_norm/", "model.decoder.layer_norm.")]
    for part, n in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(n):
            src, dst = f"{part}/layer_{i}/", f"model.{part}.layers.{i}."
            names += [*_norm(src + "self_attention/layer_norm/", dst + "self_attn_layer_norm."),
                      *_linear(src + "self_attention/linear_1/", dst + "self_attn.out_proj."),
                      *_norm(src + "ffn/layer_norm/", dst + "final_layer_norm."),
                      *_linear(src + "ffn/linear_0/", dst + "fc1."), *_linear(src + "ffn/linear_1/", dst + "fc2.")]
            if part == "decoder":
                names += [*_norm(src + "attention/layer_norm/", dst + "encoder_attn_layer_norm."),
                          *_linear(src + "attention/linear_0/", dst + "encoder_attn.q_proj."),
                          *_linear(src + "attention/linear_2/", dst + "encoder_attn.out_proj.")]
    return names


def _fused_names(encoder_layers: int, decoder_layers: int) -> list[tuple[str, list[str]]]:
    """(CTranslate2 fused projection, the transformers projections it holds, in order)."""
    names = []
    for part, n in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(n):
            dst = f"model.{part}.layers.{i}."
            names.append((f"{part}/layer_{i}/self_attention/linear_0", [f"{dst}self_attn.{p}_proj" for p in "qkv"]))
            if part == "decoder":
                names.append((f"{part}/layer_{i}/attention/linear_1", [f"{dst}encoder_attn.{p}_proj" for p in "kv"]))
    return names


def to_state_dict(ct2: Ct2File) -> tuple[dict[str, torch.Tensor], WhisperConfig]:
    """Maps CTranslate2 Whisper variables onto transformers' names, in float32.

    Args:
        ct2: A file read by :func:`asr.models.ct2.read_ct2`.

    Returns:
        The state dict of ``WhisperForConditionalGeneration`` and the architecture inferred from the shapes
        (token ids are left at their defaults: :func:`convert_ct2` sets them from the tokenizer).

    Raises:
        ModelFileError: Not a Whisper spec, a variable is missing or has an unexpected shape or flag, or
            tensors are left over that this converter does not understand.
    """
    v = ct2.variables
    if ct2.spec != "WhisperSpec":
        raise ModelFileError(f"{ct2.path}: spec {ct2.spec!r} is not a Whisper model (expected 'WhisperSpec')")
    for flag, expected in _EXPECTED_FLAGS.items():
        if flag in v and _scalar(ct2, flag) != expected:
            raise ModelFileError(f"{ct2.path}: {flag} is {_scalar(ct2, flag)}, this converter supports {expected}")
    try:
        conv1 = v["encoder/conv1/weight"]
        d_model, n_mels = int(conv1.shape[0]), int(conv1.shape[1])
        layers = {part: 1 + max(int(m.group(1)) for m in (re.match(rf"{part}/layer_(\d+)/", k) for k in v) if m)
                  for part in ("encoder", "decoder")}
        config = WhisperConfig(
            vocab_size=int(v["decoder/embeddings/weight"].shape[0]), num_mel_bins=n_mels, d_model=d_model,
            encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
            encoder_attention_heads=_scalar(ct2, "encoder/num_heads"),
            decoder_attention_heads=_scalar(ct2, "decoder/num_heads"),
            encoder_ffn_dim=int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
            decoder_ffn_dim=int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
            max_source_positions=int(v["encoder/position_encodings/encodings"].shape[0]),
            max_target_positions=int(v["decoder/position_encodings/encodings"].shape[0]),
        )
    except (KeyError, ValueError, IndexError) as e:
        raise ModelFileError(f"{ct2.path}: not a complete Whisper model ({e})") from None

    sd: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def put(src: str, dst: str) -> None:
        if src not in v:
            raise ModelFileError(f"{ct2.path}: missing variable {src!r}")
        sd[dst] = _float(ct2, src)
        used.update((src, f"{src}_scale"))

    def split(src: str, dsts: Sequence[str]) -> None:
        """Splits a fused projection ([n*d, d] weight, [n*d] bias) into its parts (k has no bias)."""
        for kind in ("weight", "bias"):
            name = f"{src}/{kind}"
            if name not in v or v[name].shape[0] != len(dsts) * d_model:
                raise ModelFileError(f"{ct2.path}: {name!r} missing or not {len(dsts)} x d_model={d_model} rows")
            used.update((name, f"{name}_scale"))
            for dst, part in zip(dsts, _float(ct2, name).chunk(len(dsts))):
                # k's bias only adds q.b_k to every score of one query: softmax ignores it, so dropping is exact.
                if not (kind == "bias" and dst.endswith("k_proj")):
                    sd[f"{dst}.{kind}"] = part.contiguous()

    for src, dst in _plain_names(config.encoder_layers, config.decoder_layers):
        put(src, dst)
    for src, dsts in _fused_names(config.encoder_layers, config.decoder_layers):
        split(src, dsts)

    projection = "decoder/projection/weight"
    used.add(projection)
    embeddings = sd["model.decoder.embed_tokens.weight"]
    head = embeddings
    if projection in v and ct2.aliases.get(projection) != "decoder/embeddings/weight":
        head = _float(ct2, projection)
    config.tie_word_embeddings = head is embeddings or torch.equal(head, embeddings)
    sd["proj_out.weight"] = embeddings if config.tie_word_embeddings else head
    leftover = sorted(k for k in v if k not in used and k not in _EXPECTED_FLAGS and v[k].dim() > 0)
    if leftover:
        raise ModelFileError(f"{ct2.path}: {len(leftover)} variables this converter does not map, e.g. {leftover[0]!r}")
    return sd, config


def convert_ct2(model_files: Sequence[Path], config_json: Path, tokenizer_json: Path, out_dir: Path) -> None:
    """Converts a faster-whisper model into a transformers folder (model, generation config, processor).

    Args:
        model_files: ``model.bin``, or its parts in order.
        config_json: The faster-whisper ``config.json``.
        tokenizer_json: The faster-whisper ``tokenizer.json``.
        out_dir: Folder to write (created).

    Raises:
        ModelFileError: Any input file is missing, damaged, or not a Whisper model.
    """
    try:
        ct2_config = json.loads(Path(config_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{config_json}: not a readable JSON file ({e})") from None
    if "suppress_ids" not in ct2_config:
        logger.warning("%s has no suppress_ids; no tokens will be suppressed", config_json)
    tokenizer = build_tokenizer(Path(tokenizer_json))
    sd, config = to_state_dict(read_ct2(model_files))
    if config.vocab_size != len(tokenizer):
        raise ModelFileError(f"{model_files[0]}: vocabulary of {config.vocab_size} does not match the tokenizer's "
                             f"{len(tokenizer)} tokens (BPE, specials and timestamps)")
    is_multilingual = config.vocab_size >= 51865  # openai/whisper's own test
    generation_config = build_generation_config(ct2_config, tokenizer, is_multilingual, config.decoder_layers,
                                                config.decoder_attention_heads)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "begin_suppress_tokens"):
        setattr(config, key, getattr(generation_config, key))

    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    try:
        model.load_state_dict(sd, strict=True, assign=True)
    except RuntimeError as e:
        raise ModelFileError(f"{model_files[0]}: weights do not fit the inferred architecture: "
                             f"{str(e).splitlines()[-1].strip()}") from None
    model.tie_weights()
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ModelFileError(f"{model_files[0]}: some weights were not set by the conversion")
    model.generation_config = generation_config
    model.eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=config.num_mel_bins), tokenizer).save_pretrained(out_dir)
    logger.info("converted %s -> %s (%d parameters)", model_files[0], out_dir, model.num_parameters())
