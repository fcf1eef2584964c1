"""The decoders an evaluation compares, behind one interface: samples in, text and costs out.

- `LibraryBackend`: this project's `asr.transcription.transcribe`, plain or assisted, sequential (optionally after
  VAD) or batched.
- `TransformersBackend`: transformers' own `WhisperForConditionalGeneration.generate`, with or without
  `assistant_model`, on the same loaded model (the baseline to beat).
- `eval.backends.ctranslate2.FasterWhisperBackend`: CTranslate2 through faster-whisper, greedy (beam 1), as an
  outside speed anchor, in a process of its own.
- `eval.backends.openai_whisper.OpenAIWhisperBackend`: openai-whisper's own `transcribe()` on the same weights, the
  referee of Whisper's rules.

A backend that cannot run here raises `BackendUnavailable` when it is built, so the run skips it with a reason.
What every backend returns and the interface they share live in `eval.backends.decoded`, which both this module and
`eval.backends.ctranslate2` import.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from audio.constants import N_SAMPLES, SAMPLE_RATE
from eval.configs import EvalConfig
from eval.backends.ctranslate2 import FasterWhisperBackend
from eval.backends.decoded import Backend, BackendUnavailable, Decoded

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

# Whisper's window: audio longer than this needs transformers' long-form (sequential) call.
WINDOW_SAMPLES = N_SAMPLES


def kernel_switches(kernels: str | None) -> contextlib.ExitStack:
    """The `decoding.kernels` switches a configuration's `kernels=` names, as one context manager."""
    from decoding.kernels.products import full_head, onednn_only, reference_kernels

    stack = contextlib.ExitStack()
    stack.enter_context(reference_kernels(kernels == "aten"))
    stack.enter_context(onednn_only(kernels == "onednn"))
    stack.enter_context(full_head(kernels == "full-head"))
    return stack


class LibraryBackend:
    """`asr.transcription.transcribe`, with or without an assistant."""

    def __init__(self, config: EvalConfig, bundle: WhisperBundle, assistant: Any) -> None:
        from asr.options import TranscribeOptions

        self.config = config
        self.bundle = bundle
        self.assistant = assistant
        options = TranscribeOptions()
        if config.schedule is not None:
            options = replace(options, schedule=config.schedule)
        if config.num_assistant_tokens is not None:
            options = replace(options, num_assistant_tokens=config.num_assistant_tokens)
        if config.temperature is not None:
            options = replace(options, temperatures=(config.temperature,))
        if config.vad:
            from audio.vad import VadOptions

            options = replace(options, vad=VadOptions())
        if config.kind == "batched":
            options = replace(options, batch_size=config.batch_size, timestamps=config.timestamps)
        if config.kind == "beam":
            options = replace(options, beam_size=config.beam_size, best_of=config.best_of, patience=config.patience)
        self.options = options

    def decode(self, samples: np.ndarray, language: str | None) -> Decoded:
        from asr.transcription import transcribe

        with kernel_switches(self.config.kernels):
            transcript = transcribe(self.bundle, samples, replace(self.options, language=language), self.assistant)
        return self._decoded(transcript)


    def decode_many(self, samples: list[np.ndarray], languages: list[str | None]) -> list[Decoded]:
        """Several items decoded together, as `asr batch --batch-size` decodes them (their windows share
        batches); items of one language at a time. Per-item seconds are not known: the runner times the call."""
        from asr.transcription import Transcriber

        results: list[Decoded | None] = [None] * len(samples)
        for language in dict.fromkeys(languages):
            rows = [i for i, code in enumerate(languages) if code == language]
            transcriber = Transcriber(self.bundle, replace(self.options, language=language), self.assistant)
            with kernel_switches(self.config.kernels):
                transcripts = transcriber.transcribe_many([samples[i] for i in rows], batch_size=len(rows))
            for i, transcript in zip(rows, transcripts):
                results[i] = self._decoded(transcript)
        return results  # type: ignore[return-value]

    def _decoded(self, transcript: Any) -> Decoded:
        stats, generation = transcript.stats, transcript.stats.generation
        assisted = self.assistant is not None
        return Decoded(
            text=transcript.text, language=transcript.language,
            encode_seconds=stats.encode_seconds, decode_seconds=stats.decode_seconds,
            generated_tokens=generation.generated_tokens, model_forward_passes=generation.model_forward_passes,
            assistant_forward_passes=generation.assistant_forward_passes if assisted else None,
            drafted_tokens=generation.drafted_tokens if assisted else None,
            accepted_tokens=generation.accepted_tokens if assisted else None,
            rounds=generation.rounds if assisted else None,
            accepted_length_histogram=dict(generation.accepted_length_histogram) if assisted else None,
            assistant=stats.assistant,
        )


class TransformersBackend:
    """transformers' `generate()` on the loaded model, optionally with `assistant_model`, called as its users would.

    Greedy, no temperature fallback. Up to 30 s: the short-form call, without timestamps (transformers 5.24's
    assisted path with timestamps and fewer than 20 drafts per round stops after the first round's text).
    Longer: the long-form call with timestamps (each window without the previous text, transformers' default).

    Forward passes are counted with hooks on the top-level modules (the encoder runs through `get_encoder()`,
    so it is not counted) and encoder time with hooks on the encoders. transformers' assisted generation does not
    report acceptance, so drafts and acceptance are left unknown; tokens per model pass still show the gain.
    """

    def __init__(self, config: EvalConfig, bundle: WhisperBundle, assistant_bundle: WhisperBundle | None) -> None:
        self.config = config
        self.bundle = bundle
        self.assistant_model = None
        # The assistant's generation config for this configuration's k and schedule (None: the model's own).
        self.assistant_generation_config = None
        self.extra: dict[str, Any] = {}
        if config.kind == "transformers-assisted":
            if assistant_bundle is None:
                # The model assisting itself: a copy, so its passes are counted apart (transformers re-encodes
                # for the assistant either way).
                self.assistant_model = copy.deepcopy(bundle.model).eval()
            else:
                self.assistant_model = assistant_bundle.model
                if assistant_bundle.tokenizer.get_vocab() != bundle.tokenizer.get_vocab():
                    # Universal Assisted Generation: transformers refuses other tokenizers unless given both.
                    self.extra.update(tokenizer=bundle.tokenizer, assistant_tokenizer=assistant_bundle.tokenizer)
            if config.schedule is not None or config.num_assistant_tokens is not None:
                # Otherwise transformers' own defaults, as its users get them. "heuristic" becomes
                # "heuristic_transient", which restarts k on every call as this library does per item; plain
                # "heuristic" would carry k from one item into the next. Set per call: configurations may
                # share an assistant.
                generation_config = copy.deepcopy(self.assistant_model.generation_config)
                if config.schedule is not None:
                    generation_config.num_assistant_tokens_schedule = \
                        "heuristic_transient" if config.schedule == "heuristic" else config.schedule
                if config.num_assistant_tokens is not None:
                    generation_config.num_assistant_tokens = config.num_assistant_tokens
                self.assistant_generation_config = generation_config

    def decode(self, samples: np.ndarray, language: str | None) -> Decoded:
        import torch

        bundle, model = self.bundle, self.bundle.model
        long_form = len(samples) > WINDOW_SAMPLES
        counts = _PassCounter(model, self.assistant_model)
        start = time.perf_counter()
        if long_form:
            inputs = bundle.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                              truncation=False, padding="longest", return_attention_mask=True)
        else:
            inputs = bundle.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt")
        parameter = next(model.parameters())
        kwargs: dict[str, Any] = dict(self.extra)
        kwargs["input_features"] = inputs.input_features.to(parameter.device, parameter.dtype)
        if long_form:
            # Sequential long-form needs timestamps. transformers' default of not conditioning on the previous
            # text is kept: without its temperature fallback, conditioning lets greedy decoding loop.
            kwargs.update(attention_mask=inputs.attention_mask.to(parameter.device), return_timestamps=True)
        if bundle.is_multilingual:
            kwargs["task"] = "transcribe"
            if language is not None:
                kwargs["language"] = language
        if self.assistant_model is not None:
            kwargs["assistant_model"] = self.assistant_model
        with counts, self._assistant_settings(), torch.inference_mode():
            output = model.generate(**kwargs)
        seconds = time.perf_counter() - start
        sequences = output if torch.is_tensor(output) else output["sequences"]
        eot = bundle.special.eot
        # Prompt and end tokens are specials (>= eot in Whisper's vocabulary), and so are timestamps.
        tokens = [t for t in sequences[0].tolist() if t < eot]
        # Text and timestamp tokens, and one end token (transformers drops it from the output; one per window
        # in long-form, which this undercounts).
        produced = [t for t in sequences[0].tolist() if t < eot or t >= bundle.special.timestamp_begin] + [eot]
        return Decoded(
            text=bundle.tokenizer.decode(tokens), language=language,
            encode_seconds=counts.encode_seconds, decode_seconds=max(seconds - counts.encode_seconds, 0.0),
            generated_tokens=len(produced), model_forward_passes=counts.model_passes,
            assistant_forward_passes=counts.assistant_passes if self.assistant_model is not None else None,
            rounds=counts.model_passes if self.assistant_model is not None else None,
        )

    @contextlib.contextmanager
    def _assistant_settings(self) -> Iterator[None]:
        """This configuration's generation config on the assistant for one call."""
        if self.assistant_generation_config is None:
            yield
            return
        saved = self.assistant_model.generation_config
        self.assistant_model.generation_config = self.assistant_generation_config
        try:
            yield
        finally:
            self.assistant_model.generation_config = saved


class _PassCounter:
    """Counts forward passes of a model and its assistant, and times their encoders, through module hooks."""

    def __init__(self, model: Any, assistant: Any | None) -> None:
        self.model, self.assistant = model, assistant
        self.model_passes = self.assistant_passes = 0
        self.encode_seconds = 0.0
        self._handles: list[Any] = []
        self._started: list[float] = []

    def __enter__(self) -> "_PassCounter":
        self._handles.append(self.model.register_forward_hook(lambda *_: self._count("model_passes")))
        encoders = [self.model.get_encoder()]
        if self.assistant is not None:
            self._handles.append(self.assistant.register_forward_hook(lambda *_: self._count("assistant_passes")))
            if hasattr(self.assistant, "get_encoder"):
                encoders.append(self.assistant.get_encoder())
        for encoder in encoders:
            self._handles.append(encoder.register_forward_pre_hook(lambda *_: self._start()))
            self._handles.append(encoder.register_forward_hook(lambda *_: self._stop()))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _count(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)

    def _start(self) -> None:
        self._started.append(time.perf_counter())

    def _stop(self) -> None:
        if self._started:
            self.encode_seconds += time.perf_counter() - self._started.pop()


def make_backends(configs: list[EvalConfig], model_name: str, bundle: WhisperBundle, *, device: str, dtype: Any,
                  threads: int, offload: Any = None) -> tuple[list[Backend], dict[str, str]]:
    """Builds a backend for each configuration; assistants named twice are loaded once. The model in another
    precision than the run's (`dtype=`) is loaded with the run's `offload` too.

    Returns:
        (the backends that can run, in the configurations' order; skipped configuration name -> reason).

    Raises:
        ValueError: an assistant that does not exist or cannot work with the model (before any decoding).
    """
    from asr.assist.choose import make_assistant
    from asr.models.precision import INT8, resolve_precision
    from asr.models.registry import load_model

    assistants: dict[tuple[str, Any, bool, bool], Any] = {}
    bundles: dict[str, Any] = {}
    # The model in each precision a configuration asks for (the run's own is `bundle`; int8 per kernel kind).
    models: dict[tuple[Any, bool], Any] = {(dtype, False): bundle}
    backends: list[Backend] = []
    skipped: dict[str, str] = {}
    for config in configs:
        try:
            if config.kind in ("greedy", "assisted", "batched", "beam"):
                precision = dtype if config.dtype is None else resolve_precision(config.dtype, device)
                # An int8 model's and an int8 draft's form depends on the kernels (float32 activations over
                # decoding.kernels.native, else bfloat16): built under the configuration's switches, as it runs.
                plain_kernels = config.kernels in ("aten", "onednn")
                form = (precision, plain_kernels and precision == INT8)
                with kernel_switches(config.kernels):
                    if form not in models:
                        models[form] = load_model(model_name, device=device, dtype=precision, offload=offload)
                    model = models[form]
                    assistant = None
                    if config.uses_assistant:
                        batched = config.kind == "batched"  # `auto` depends on it
                        key = (config.assistant, form, batched, plain_kernels)
                        if key not in assistants:
                            assistants[key] = make_assistant(config.assistant, model, device=device,
                                                             dtype=precision, batched=batched)
                        assistant = assistants[key]
                backends.append(LibraryBackend(config, model, assistant))
            elif config.kind in ("transformers", "transformers-assisted"):
                assistant_bundle = None
                if config.kind == "transformers-assisted" and config.assistant != "self":
                    if config.assistant.startswith("self:"):
                        raise ValueError(f"configuration {config.name!r}: transformers' assisted generation "
                                         "takes a whole model; use transformers-assisted:self or a model name")
                    if config.assistant not in bundles:
                        bundles[config.assistant] = load_model(config.assistant, device=device, dtype=dtype)
                    assistant_bundle = bundles[config.assistant]
                backends.append(TransformersBackend(config, bundle, assistant_bundle))
            elif config.kind == "openai-whisper":
                import torch

                from eval.backends.openai_whisper import OpenAIWhisperBackend

                # openai-whisper computes in float32 (its `fp16=False`): the float32 weights, whatever the run's.
                form = (torch.float32, False)
                if form not in models:
                    models[form] = load_model(model_name, device=device, dtype=torch.float32, offload=offload)
                backends.append(OpenAIWhisperBackend(config, models[form], device))
            else:
                backends.append(FasterWhisperBackend(config, model_name, device, threads))
        except BackendUnavailable as reason:
            skipped[config.name] = str(reason)
    return backends, skipped
