"""Find, convert, cache and load Whisper models by name.

A name is one of: an installed weight package (``base``, ``tiny.en``: CTranslate2 files converted once into
the cache), a short alias of a Hub model (``large-v3``, ``distil-large-v3``, ...), a Hub id ``org/name``,
a local transformers folder, or a local faster-whisper (CTranslate2) folder (converted through the cache,
`asr.models.cache`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizerFast,
)

from asr.errors import first_line
from asr.models.cache import (
    PACKAGES,
    Ct2Source,
    cache_dir,
    cache_problem,
    convert_into_cache,
    ct2_source,
    package_source,
)
from asr.models.ct2 import WEIGHTS_UNLIKE_CONFIG, ModelFileError
from asr.models.offload import (
    OffloadError,
    OffloadOptions,
    load_offloaded,
    resolve_offload,
)
from asr.models.precision import (
    INT8,
    Precision,
    load_dtype,
    pack_decoder,
    quantize_model,
)
from asr.models.tokenizer import SpecialTokens, build_generation_config, special_tokens
from audio.constants import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from decoding.kernels.encoder_attention import use_native_encoder_attention
from decoding.kernels.products import use_cpu_kernels

__all__ = ["ModelFileError", "ModelInfo", "ModelNotFoundError", "SpecialTokens", "UnsupportedModelError",
           "WhisperBundle", "cache_dir", "known_models", "load_model"]

logger = logging.getLogger(__name__)

#: Seconds allowed for the check that the Hub answers before a download is tried (its client retries for ~30 s).
HUB_PROBE_TIMEOUT = 3.0

#: Short names of Hub models. An installed package of the same name (see PACKAGES) wins.
HUB_ALIASES: dict[str, str] = {
    **{n: f"openai/whisper-{n}" for n in ("tiny", "tiny.en", "base", "base.en", "small", "small.en", "medium",
                                           "medium.en", "large-v2", "large-v3", "large-v3-turbo")},
    "large-v1": "openai/whisper-large", "turbo": "openai/whisper-large-v3-turbo",
    **{n: f"distil-whisper/{n}" for n in ("distil-large-v3.5", "distil-large-v3", "distil-large-v2",
                                           "distil-medium.en", "distil-small.en")},
}


class ModelNotFoundError(ValueError):
    """A model name that resolves to nothing loadable here."""


class UnsupportedModelError(ValueError):
    """A model that exists but is not a ``WhisperForConditionalGeneration``."""


@dataclass(frozen=True)
class WhisperBundle:
    """A loaded Whisper model with everything needed to run it."""

    name: str  # the name it was loaded by
    model: WhisperForConditionalGeneration  # in eval mode, on the requested device and dtype
    tokenizer: WhisperTokenizerFast
    feature_extractor: WhisperFeatureExtractor
    generation_config: GenerationConfig  # complete: generate(language=..., task=...) works
    special: SpecialTokens  # special token ids as plain ints
    is_multilingual: bool
    n_mels: int  # mel bins the encoder expects (80, or 128 for large-v3)
    alignment_heads: tuple[tuple[int, int], ...]  # (decoder layer, head) pairs for word timestamps
    source: str  # "package:...", "hub:org/name", "local:/path" or "ct2:/path"


@dataclass(frozen=True)
class ModelInfo:
    """One entry of :func:`known_models`."""

    name: str  # short name
    resolves_to: str  # the source it loads from, as in WhisperBundle.source
    installed: bool  # weights are on this machine (package installed, or in the Hub cache)
    cached: bool  # a complete converted copy (or Hub download) is ready


def _hub_problem(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hub cannot be reached now, or None when a download may be tried."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # through a proxy a direct connection says nothing
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    error: list[str] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as e:
            error.append(e.strerror or str(e) or type(e).__name__)

    # A thread bounds the DNS lookup too, which create_connection's timeout does not cover.
    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout + 0.5)
    if probe.is_alive():
        return f"no answer from {host} within {timeout:g} s"
    return f"cannot reach {host}: {error[0]}" if error else None


# Whisper's sizes, with room for larger models than any published (large-v3: d_model 1280, 32 layers, 51866
# tokens): a config beyond them is damaged or crafted, and would ask for more memory than a machine has.
_CONFIG_LIMITS = {"d_model": 16384, "encoder_layers": 256, "decoder_layers": 256, "encoder_attention_heads": 256,
                  "decoder_attention_heads": 256, "encoder_ffn_dim": 65536, "decoder_ffn_dim": 65536,
                  "vocab_size": 1 << 20, "num_mel_bins": 256, "max_source_positions": 1 << 16,
                  "max_target_positions": 1 << 16}


# The framing of every Whisper model's log-mel features, which `audio.features` computes.
WHISPER_FEATURES = {"sampling_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH,
                    "chunk_length": CHUNK_LENGTH, "n_samples": N_SAMPLES, "nb_max_frames": N_FRAMES}


def check_config(config: WhisperConfig, src: str) -> None:
    """Refuses sizes no Whisper has (0, negative, not whole numbers, beyond `_CONFIG_LIMITS`) in one line.

    Raises:
        ModelFileError: naming the folder and the field.
    """
    for field, limit in _CONFIG_LIMITS.items():
        value = getattr(config, field, None)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ModelFileError(f"{src}: config.json gives {field} = {value!r}; a Whisper model has a whole number "
                                 f"from 1 to {limit} there")
    for part in ("encoder", "decoder"):
        heads = getattr(config, f"{part}_attention_heads")
        if config.d_model % heads:
            raise ModelFileError(f"{src}: config.json gives d_model {config.d_model}, which {heads} "
                                 f"{part} attention heads do not divide")


def _load_folder(src: str, name: str, source: str, device: str, dtype: Precision,
                 offload: OffloadOptions | None = None, **hub: object) -> WhisperBundle:
    """Loads a transformers Whisper folder or Hub id into a bundle (``hub``: extra from_pretrained options)."""
    try:
        config = WhisperConfig.from_pretrained(src, **hub)
    except OSError:
        raise
    except Exception as error:  # unreadable JSON, not a Whisper config, a field of the wrong type
        raise ModelFileError(f"{src}: config.json is not a Whisper config ({first_line(error)})") from None
    check_config(config, src)
    architectures = config.architectures or ["WhisperForConditionalGeneration"]
    if "WhisperForConditionalGeneration" not in architectures:
        raise UnsupportedModelError(f"model {name!r} is a {'/'.join(architectures)}; load_model needs a "
                                    "WhisperForConditionalGeneration (decoder-only assistants load separately)")
    if offload is not None:
        model = load_offloaded(_local_folder(src, **hub), config, offload, device, dtype)
    else:
        try:
            model, info = WhisperForConditionalGeneration.from_pretrained(
                src, dtype=load_dtype(dtype), use_safetensors=True, trust_remote_code=False, output_loading_info=True,
                **hub)
        except OSError:
            raise
        except Exception as error:  # a crafted or damaged weights file: safetensors' and torch's own errors
            if "mismatched" in str(error) or "size mismatch" in str(error):
                raise ModelFileError(f"{src}: {WEIGHTS_UNLIKE_CONFIG} (transformers: size mismatch)") from None
            raise ModelFileError(f"{src}: the weights cannot be read ({type(error).__name__}: "
                                 f"{first_line(error)})") from None
        # transformers fills what the weights lack with random values, and drops what the config does not name,
        # and only reports it: refuse such a model.
        missing = list(info.get("missing_keys") or ()) + list(info.get("unexpected_keys") or ()) + [
            str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ()]
        if missing:
            shown = ", ".join(sorted(missing)[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise ModelFileError(f"{src}: {WEIGHTS_UNLIKE_CONFIG} ({shown})")
        model = model.to(device).eval()
        if dtype == INT8:
            quantize_model(model)
    if device == "cpu":
        # An offloaded model is short of memory: no second, packed copy of its head (106 MB for base in
        # float32, ~10 % of a pass; docs/offload.md).
        use_cpu_kernels(model, pack_head=offload is None)
        use_native_encoder_attention(model.get_encoder())  # a bfloat16 encoder (int8, bfloat16) without AMX
        if dtype == torch.bfloat16:
            pack_decoder(model)
    try:
        tokenizer = WhisperTokenizerFast.from_pretrained(src, **hub)
    except OSError:
        raise
    except Exception as error:  # the tokenizers library raises its own types for a damaged tokenizer.json
        raise ModelFileError(f"{src}: the tokenizer files cannot be read ({first_line(error)})") from None
    try:
        feature_extractor = WhisperFeatureExtractor.from_pretrained(src, **hub)
    except OSError:
        raise
    except Exception as error:  # not JSON, or values transformers cannot build an extractor from
        raise ModelFileError(f"{src}: the feature extractor config cannot be read ({first_line(error)})") from None
    if feature_extractor.feature_size != config.num_mel_bins:
        raise ModelFileError(f"{src}: feature extractor makes {feature_extractor.feature_size!r} mel bins, "
                             f"the model expects {config.num_mel_bins}")
    for field, value in WHISPER_FEATURES.items():  # audio.features computes Whisper's features, and no others
        if getattr(feature_extractor, field, value) != value:
            raise ModelFileError(f"{src}: its feature extractor config gives {field} = "
                                 f"{str(getattr(feature_extractor, field))[:40]}; Whisper's features have {value}")
    gen = model.generation_config
    flag = getattr(gen, "is_multilingual", None)
    is_multilingual = bool(flag) if flag is not None else config.vocab_size >= 51865  # openai/whisper's test
    # Folders saved by hand may carry a partial generation config (max_length 20, no token ids): fill the
    # fields left at their class defaults from the tokenizer, as the converter would have.
    defaults = build_generation_config({}, tokenizer, is_multilingual, config.decoder_layers,
                                       config.decoder_attention_heads)
    given = gen.to_diff_dict()
    for key, value in defaults.to_diff_dict().items():
        if key not in given or getattr(gen, key, None) is None:
            setattr(gen, key, value)
    return WhisperBundle(
        name=name, model=model, tokenizer=tokenizer, feature_extractor=feature_extractor, generation_config=gen,
        special=special_tokens(tokenizer, gen, is_multilingual), is_multilingual=is_multilingual,
        n_mels=config.num_mel_bins, alignment_heads=tuple((int(a), int(b)) for a, b in gen.alignment_heads),
        source=source)


def _local_folder(src: str, **hub: object) -> Path:
    """A local folder with `src`'s files (a Hub id's snapshot in the Hub cache, downloaded if allowed)."""
    if Path(src).is_dir():
        return Path(src)
    from huggingface_hub import snapshot_download

    local = bool(hub.get("local_files_only", False))
    return Path(snapshot_download(src, allow_patterns=["*.json", "*.safetensors"], local_files_only=local))


def _load_hub(repo: str, name: str, device: str, dtype: Precision,
              offload: OffloadOptions | None = None) -> WhisperBundle:
    with contextlib.suppress(OSError):  # already in the Hub cache: no network needed
        return _load_folder(repo, name, f"hub:{repo}", device, dtype, offload, local_files_only=True)
    problem = _hub_problem()
    if problem is None:
        try:
            return _load_folder(repo, name, f"hub:{repo}", device, dtype, offload)
        except OSError as e:
            problem = first_line(e)
    raise ModelNotFoundError(f"could not download {repo!r} from the Hugging Face Hub ({problem}); "
                             "check the network or pass a local folder")


def _load_ct2(src: Ct2Source, name: str, device: str, dtype: Precision,
              offload: OffloadOptions | None = None) -> WhisperBundle:
    folder = convert_into_cache(src)
    try:
        return _load_folder(str(folder), name, src.source, device, dtype, offload, local_files_only=True)
    except (ModelNotFoundError, UnsupportedModelError):
        raise
    except OffloadError:
        raise
    except Exception as e:  # whatever a damaged cache makes transformers or safetensors raise: rebuild once
        logger.warning("cached model %s cannot be loaded (%s: %s); rebuilding it", folder, type(e).__name__, e)
    folder = convert_into_cache(src, force=True)
    return _load_folder(str(folder), name, src.source, device, dtype, offload, local_files_only=True)


def _known_names() -> str:
    return ", ".join(dict.fromkeys([*PACKAGES, *HUB_ALIASES]))


def load_model(name: str, *, device: str = "cpu", dtype: Precision = torch.float32,
               offload: OffloadOptions | None = None) -> WhisperBundle:
    """Loads a Whisper model by name, converting and caching CTranslate2 weights on first use.

    Args:
        name: A package name (``base``, ``tiny.en``), a Hub alias (``large-v3``, ``turbo``, ...), a Hub id
            (``org/name``), a local transformers folder, or a local faster-whisper folder.
        device: Torch device to put the model on.
        dtype: Dtype of the model's weights, or ``"int8"`` (CPU only; ``asr.models.precision.quantize_model``).
        offload: Decoder layers to keep on disk (or in CPU memory for a GPU) and bring in per pass
            (``asr.models.offload``); None keeps the whole model on ``device``.

    Returns:
        The model in eval mode with its tokenizer, feature extractor, complete generation config and ids.

    Raises:
        ModelNotFoundError: The name is unknown, a folder is incomplete, or a Hub model cannot be downloaded.
        UnsupportedModelError: The checkpoint is not a ``WhisperForConditionalGeneration``.
        ModelFileError: The model's files are damaged or not a Whisper model.
        ValueError: Offload options the device cannot use, or a ``max_memory`` too small for the resident parts.
    """
    offload = resolve_offload(offload, device)
    if dtype == INT8 and (device != "cpu" or offload is not None):
        raise ValueError("int8 models run on the CPU, without --offload" if device == "cpu" else
                         f"int8 models run on the CPU only; on {device} use float16 or bfloat16")
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "model.bin").is_file():
            return _load_ct2(ct2_source(path), name, device, dtype, offload)
        if not (path / "config.json").is_file() or not any(path.glob("model*.safetensors*")):
            raise ModelNotFoundError(f"{path}: not a model folder (needs config.json and *.safetensors, or a "
                                     "faster-whisper model.bin)")
        # transformers would build an empty tokenizer from a folder without one.
        missing = [f for f, alternatives in (("tokenizer.json", ("tokenizer.json", "vocab.json")),
                                             ("preprocessor_config.json",
                                              ("preprocessor_config.json", "processor_config.json")))
                   if not any((path / a).is_file() for a in alternatives)]
        if missing:
            raise ModelNotFoundError(f"{path}: incomplete model folder, no {' or '.join(missing)}")
        try:
            return _load_folder(str(path), name, f"local:{path.resolve()}", device, dtype, offload,
                                local_files_only=True)
        except OSError as e:
            raise ModelNotFoundError(f"{path}: cannot load ({first_line(e)})") from None
    if name in PACKAGES and (package := package_source(name)) is not None:
        return _load_ct2(package, name, device, dtype, offload)
    if name in HUB_ALIASES:
        return _load_hub(HUB_ALIASES[name], name, device, dtype, offload)
    # A relative path whose first folder exists here is a local path, however Hub-like it looks.
    if path.exists() or name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 \
            or Path(name.split("/")[0]).is_dir():
        raise ModelNotFoundError(f"{name}: {'not a folder' if path.exists() else 'no such model folder'}")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return _load_hub(name, name, device, dtype, offload)
    raise ModelNotFoundError(f"unknown model {name!r}; known names: {_known_names()}, or a hub id (org/name) "
                             "or a local folder")


def _in_hub_cache(repo: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    def has(file: str) -> bool:
        return isinstance(try_to_load_from_cache(repo, file), str)

    return has("config.json") and (has("model.safetensors") or has("model.safetensors.index.json"))


def known_models() -> list[ModelInfo]:
    """Every short name with what it resolves to and whether it is installed and cached (``asr models``)."""
    infos = []
    for name in dict.fromkeys([*PACKAGES, *HUB_ALIASES]):
        package = package_source(name) if name in PACKAGES else None
        if package is not None:
            cached = cache_problem(cache_dir() / package.key, package, check_content=False) is None
            infos.append(ModelInfo(name, package.source, installed=True, cached=cached))
        else:
            in_cache = _in_hub_cache(HUB_ALIASES[name])
            infos.append(ModelInfo(name, f"hub:{HUB_ALIASES[name]}", installed=in_cache, cached=in_cache))
    return infos
