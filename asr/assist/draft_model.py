"""A draft model: a few decoder layers that read their model's encoder output and share its embeddings.

A draft only has to agree with its model, not to transcribe well, so it keeps a couple of the model's own
decoder layers (distil-whisper starts its students from the first and last layers) and borrows everything
else from the model at load time: encoder, token and position embeddings, the output head (tied to the token
embeddings). Its folder holds just the trained layers and final layer norm, a few MB:

    draft.json         format, model it was trained for, teacher layers, shapes, how it was trained
    model.safetensors  the layers, the final layer norm, `probe.*`: samples of the model's weights that the
                       draft checks at load time, so it refuses a model it was not trained for, and (when
                       restricted) `vocabulary`: the token ids it drafts
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file

from asr.errors import first_line
from asr.models.int8 import dequantize_linears
from decoding.kernels.int8 import Int8Linear
from decoding.kernels.products import OneDnnLinear, WidenedLinear

FORMAT = "assisted-whisper-draft"
VERSION = 1
CONFIG_FILE = "draft.json"
WEIGHTS_FILE = "model.safetensors"
# Token ids whose embeddings the probe keeps: common text, specials and timestamps of both vocabularies.
PROBE_IDS = (11, 13, 262, 1000, 5000, 20000, 40000, 50256, 50257, 50258, 50362, 50363, 50364)


class DraftMismatch(ValueError):
    """A draft trained for another model than the one it is paired with."""


class SubsetHead(torch.nn.Module):
    """The model's output head restricted to the tokens a draft may propose; the others get -inf.

    On a CPU a draft step is bound by reading weights, and the head is most of a small draft's weights (base:
    51,865 x 512 against two layers of 4.2 M); a draft proposes only tokens that speech in its languages uses,
    so it can skip the rest. The logits keep the full vocabulary's shape, so filters and sampling see the
    usual ids; the model still verifies every token.
    """

    def __init__(self, head: torch.nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        weight = (head.to_linear() if isinstance(head, (Int8Linear, WidenedLinear)) else head).weight.detach()
        self.vocab_size = weight.shape[0]
        self.register_buffer("ids", ids.to(device=weight.device, dtype=torch.long))
        # oneDNN's kernel (and its blocked layout) on a CPU, as the model's own head: MKL's, which a plain Linear
        # calls, streams the weight at about half the speed at one row (decoding/kernels/products.py).
        self.linear = OneDnnLinear(weight.shape[1], len(ids), bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(weight.index_select(0, self.ids))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.linear, OneDnnLinear) and not torch.is_grad_enabled():
            self.linear.pack()  # once per copy and dtype (copies drop the packed weight)
        sub = self.linear(x)
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, sub)


def choose_vocabulary(token_counts: dict[int, int], size: int, eot: int, vocab_size: int) -> torch.Tensor:
    """The ids a restricted draft may propose: every special and timestamp token (ids from end-of-text on),
    and `size` text tokens: those the model emitted in the training data, most frequent first, then the
    lowest ids (byte-pair merges are numbered in order of frequency in the tokenizer's training text).

    Returns:
        Sorted token ids, `[size + vocab_size - eot]` at most.
    """
    text = [t for t, _ in sorted(token_counts.items(), key=lambda kv: -kv[1]) if t < eot][:size]
    chosen = set(text)
    for token in range(eot):
        if len(chosen) >= size:
            break
        chosen.add(token)
    return torch.tensor(sorted(chosen | set(range(eot, vocab_size))), dtype=torch.long)


class DraftDecoder(torch.nn.Module):
    """A Whisper decoder of a few layers that shares its model's embeddings, positions and output head.

    Exposes `get_decoder()`, `get_output_embeddings()` and `config`, so it drafts through the same direct
    decoder pass as the model (`asr.whisper.decoder.WhisperDecoderAdapter`) and can be copied to int8 like any decoder.
    """

    def __init__(self, model: torch.nn.Module, layers: Sequence[int]) -> None:
        super().__init__()
        teacher = model.get_decoder()
        if not layers or any(i < 0 or i >= len(teacher.layers) for i in layers):
            raise ValueError(f"student layers {list(layers)} must be chosen from the model's "
                             f"{len(teacher.layers)} decoder layers (0..{len(teacher.layers) - 1})")
        self.config = copy.deepcopy(model.config)
        self.config.decoder_layers = len(layers)
        self.teacher_layers = tuple(int(i) for i in layers)
        # A shallow copy shares the embeddings (and every other submodule) with the model; then it gets its own
        # layers and final norm, deep copies of the teacher's that training changes.
        self.decoder = copy.copy(teacher)
        self.decoder._modules = dict(teacher._modules)
        self.decoder.layers = torch.nn.ModuleList(_own_copy(teacher.layers[i]) for i in layers)
        self.decoder.layer_norm = copy.deepcopy(teacher.layer_norm)
        self.decoder.config = self.config
        self.proj_out = model.get_output_embeddings()
        self.vocabulary: torch.Tensor | None = None  # the ids it may draft, when restricted

    def get_decoder(self) -> torch.nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.proj_out

    def restrict_vocabulary(self, ids: torch.Tensor) -> None:
        """Drafts only the tokens `ids` from now on (see `SubsetHead`)."""
        self.proj_out = SubsetHead(self.proj_out, ids)
        self.vocabulary = ids

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        """The draft's own parameters (layers and final norm), by the names they are saved under."""
        own = {f"layers.{name}": p for name, p in self.decoder.layers.named_parameters()}
        own.update({f"layer_norm.{name}": p for name, p in self.decoder.layer_norm.named_parameters()})
        return own

    def forward(self, input_ids: torch.Tensor, encoder_output: torch.Tensor) -> torch.Tensor:
        """Logits for every position: `[batch, seq]` ids and `[batch, frames, d_model]` -> `[batch, seq, vocab]`."""
        hidden = self.decoder(input_ids=input_ids, encoder_hidden_states=encoder_output, use_cache=False)
        return self.proj_out(hidden.last_hidden_state)


def _own_copy(layer: torch.nn.Module) -> torch.nn.Module:
    """A resident copy of a teacher layer, also when the model's layers are offloaded (`asr.models.offload`)."""
    from accelerate.hooks import remove_hook_from_module

    from asr.models.offload import materialized

    with materialized(layer):
        # An int8 model's layers (`--dtype int8`) give a draft model plain bfloat16 layers to load its weights into.
        return dequantize_linears(remove_hook_from_module(copy.deepcopy(layer)))


def model_probe(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Samples of the model's weights that identify it: some token embeddings and the encoder's last norm."""
    embed = model.get_decoder().embed_tokens.weight
    ids = torch.tensor([i for i in PROBE_IDS if i < embed.shape[0]], device=embed.device)
    return {"probe.embed": embed.detach().index_select(0, ids).float().cpu(),
            "probe.encoder_norm": model.get_encoder().layer_norm.weight.detach().float().cpu()}


def save_draft(draft: DraftDecoder, model: torch.nn.Module, folder: str | Path, *, model_name: str,
               training: dict[str, Any]) -> None:
    """Writes a draft folder (see the module docstring); weights in float16, which drafting does not miss."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to("cpu", torch.float16).contiguous() for name, p in draft.trainable().items()}
    tensors.update(model_probe(model))
    if draft.vocabulary is not None:
        tensors["vocabulary"] = draft.vocabulary.to("cpu", torch.int32).contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    config = draft.config
    description = {
        "format": FORMAT, "version": VERSION, "model": model_name, "teacher_layers": list(draft.teacher_layers),
        "d_model": config.d_model, "decoder_attention_heads": config.decoder_attention_heads,
        "decoder_ffn_dim": config.decoder_ffn_dim, "vocab_size": config.vocab_size, "training": training,
    }
    (folder / CONFIG_FILE).write_text(json.dumps(description, indent=2) + "\n")


def is_draft_folder(path: str | Path) -> bool:
    """True for a folder written by `save_draft` (or `asr distill`)."""
    return (Path(path).expanduser() / CONFIG_FILE).is_file()


def read_description(folder: str | Path) -> dict[str, Any]:
    """The draft's `draft.json`.

    Raises:
        ValueError: the file is missing, unreadable or not a draft description.
    """
    path = Path(folder).expanduser() / CONFIG_FILE
    try:
        description = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read draft description ({error})") from None
    if not isinstance(description, dict) or description.get("format") != FORMAT:
        raise ValueError(f"{path}: not an assisted-whisper draft (format {FORMAT!r} expected)")
    if description.get("version") != VERSION:
        raise ValueError(f"{path}: draft format version {description.get('version')}, this release reads {VERSION}")
    return description


def check_draft(folder: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Checks that the draft in `folder` was trained for `model` (its shapes in `draft.json`, and the probe of
    the model's weights it keeps) without building it; returns its description.

    Raises:
        DraftMismatch: a draft trained for another model.
        ValueError: not a draft folder, or unreadable weights.
    """
    from safetensors import safe_open

    folder = Path(folder).expanduser()
    description = read_description(folder)
    config = model.config
    for key in ("d_model", "decoder_attention_heads", "decoder_ffn_dim", "vocab_size"):
        if description.get(key) != getattr(config, key):
            raise DraftMismatch(f"draft {folder} was trained for model {description.get('model')!r} ({key} "
                             f"{description.get(key)}), this model has {key} {getattr(config, key)}")
    probe = model_probe(model)
    try:
        with safe_open(str(folder / WEIGHTS_FILE), "pt") as handle:  # the probe alone, not the layers
            names = set(handle.keys())
            stored = {name: handle.get_tensor(name) for name in probe if name in names}
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{folder / WEIGHTS_FILE}: cannot read draft weights ({first_line(error)})") from None
    for name, expected in probe.items():
        found = stored.get(name)
        # Loose enough for a model loaded in half precision, far too tight for another model's weights.
        if found is None or found.shape != expected.shape or not torch.allclose(found, expected, rtol=2e-2, atol=2e-3):
            raise DraftMismatch(f"draft {folder} was trained for model {description.get('model')!r}: its encoder and "
                             "embeddings are not this model's; train one with `asr distill`")
    return description


def load_draft(folder: str | Path, model: torch.nn.Module) -> DraftDecoder:
    """Builds the draft in `folder` on top of `model` (shared embeddings and head, in the model's dtype).

    Raises:
        ValueError: not a draft folder, damaged weights, or a draft trained for another model.
    """
    folder = Path(folder).expanduser()
    description = check_draft(folder, model)
    config = model.config
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{folder / WEIGHTS_FILE}: cannot read draft weights ({first_line(error)})") from None
    for name in model_probe(model):  # checked by check_draft
        tensors.pop(name)
    layers = description.get("teacher_layers")
    if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise ValueError(f"{folder / CONFIG_FILE}: teacher_layers must be a list of layer numbers, "
                         f"got {str(layers)[:40]}")
    try:
        draft = DraftDecoder(model, layers)
    except ValueError as error:
        raise ValueError(f"{folder / CONFIG_FILE}: {error}") from None
    vocabulary = tensors.pop("vocabulary", None)
    own = draft.trainable()
    if set(tensors) != set(own):
        raise ValueError(f"{folder / WEIGHTS_FILE}: weights do not match draft.json's layers")
    param = next(model.parameters())
    with torch.no_grad():
        for name, p in own.items():
            if tensors[name].shape != p.shape:
                raise ValueError(f"{folder / WEIGHTS_FILE}: {name} has shape {tuple(tensors[name].shape)}, "
                                 f"expected {tuple(p.shape)}")
            p.copy_(tensors[name].to(device=param.device, dtype=p.dtype))
    if vocabulary is not None:
        if vocabulary.ndim != 1 or len(vocabulary) == 0 or int(vocabulary.max()) >= config.vocab_size:
            raise ValueError(f"{folder / WEIGHTS_FILE}: its draft vocabulary is not a list of token ids")
        draft.restrict_vocabulary(vocabulary.long())
    return draft.eval()
