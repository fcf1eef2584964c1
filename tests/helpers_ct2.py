"""Writing CTranslate2 ``model.bin`` files, for tests: the inverses of `asr.models.ct2.read_ct2` and
`asr.models.convert.to_state_dict`, which the library itself never needs (it only reads faster-whisper's models)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from transformers import WhisperForConditionalGeneration

from asr.models.convert import _EXPECTED_FLAGS, _fused_names, _plain_names
from asr.models.ct2 import DTYPES, PathLike

_CODES = {dtype: code for code, dtype in DTYPES.items()}


def _pack_string(s: str) -> bytes:
    raw = s.encode("utf-8") + b"\0"
    if len(raw) > 0xFFFF:
        raise ValueError(f"string too long for a CTranslate2 file: {s[:40]!r}...")
    return struct.pack("<H", len(raw)) + raw


def write_ct2(
    path: PathLike,
    variables: Mapping[str, torch.Tensor | np.ndarray],
    aliases: Mapping[str, str] | None = None,
    *,
    spec: str = "WhisperSpec",
    version: int = 6,
    revision: int = 3,
) -> None:
    """Writes variables in CTranslate2's ``model.bin`` layout (the inverse of :func:`read_ct2`).

    Args:
        path: Output file.
        variables: Name -> tensor or array; dtypes float32, int8, int16, int32, float16 or bfloat16.
        aliases: Alias name -> stored variable name.
        spec: Spec name written in the header.
        version: Binary version written in the header.
        revision: Spec revision written in the header.

    Raises:
        ValueError: A dtype has no CTranslate2 code, or an alias points to a missing variable.
    """
    aliases = dict(aliases or {})
    parts = [struct.pack("<I", version), _pack_string(spec), struct.pack("<I", revision),
             struct.pack("<I", len(variables))]
    for name, value in variables.items():
        tensor = torch.as_tensor(value).contiguous()
        if tensor.dtype not in _CODES:
            raise ValueError(f"variable {name!r}: dtype {tensor.dtype} has no CTranslate2 code")
        # A uint8 view keeps bfloat16 intact (numpy has no bfloat16).
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        parts += [_pack_string(name), struct.pack("<B", tensor.dim()),
                  struct.pack(f"<{tensor.dim()}I", *tensor.shape),
                  struct.pack("<BI", _CODES[tensor.dtype], len(raw)), raw]
    parts.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        if target not in variables:
            raise ValueError(f"alias {alias!r} points to missing variable {target!r}")
        parts += [_pack_string(alias), _pack_string(target)]
    Path(path).write_bytes(b"".join(parts))


def to_ct2_variables(model: WhisperForConditionalGeneration,
                     dtype: torch.dtype = torch.float16) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The inverse of :func:`to_state_dict`: a transformers Whisper in CTranslate2's layout.

    Args:
        model: The model to export (tied output head).
        dtype: Dtype of the exported weights.

    Returns:
        Variables (with the spec's flags and head counts) and the output-head alias.
    """
    sd = {k: t.detach().to(dtype) for k, t in model.state_dict().items()}
    cfg = model.config
    out: dict[str, torch.Tensor] = {k: torch.tensor(val, dtype=torch.int8) for k, val in _EXPECTED_FLAGS.items()}
    out["encoder/num_heads"] = torch.tensor(cfg.encoder_attention_heads, dtype=torch.int16)
    out["decoder/num_heads"] = torch.tensor(cfg.decoder_attention_heads, dtype=torch.int16)
    for src, dst in _plain_names(cfg.encoder_layers, cfg.decoder_layers):
        out[src] = sd[dst]
    for src, dsts in _fused_names(cfg.encoder_layers, cfg.decoder_layers):
        zeros = torch.zeros(cfg.d_model, dtype=dtype)  # k_proj has no bias: CTranslate2 stores zeros there
        out[f"{src}/weight"] = torch.cat([sd[f"{dst}.weight"] for dst in dsts])
        out[f"{src}/bias"] = torch.cat([sd.get(f"{dst}.bias", zeros) for dst in dsts])
    return out, {"decoder/projection/weight": "decoder/embeddings/weight"}
