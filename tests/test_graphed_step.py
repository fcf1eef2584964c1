"""Decoder steps over the CUDA graphs' buffers (`decoding.kernels.graphed_step`), checked on the CPU.

There is no CUDA graph on a CPU: within `replayed_eagerly()` a capture records a step's operations (PyTorch's own
kernels, as on a GPU) and a replay runs them again over the same tensors, each result written where the recorded
one lies, so a value read on the host at capture stays as read, as in a graph. What these tests check is what a
replay computes: the slots, positions, masks and windows it reads, the buffers' lending to caches, rows leaving
and beams widening a batch, and the fallbacks.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import weakref
from typing import Any, Callable, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from asr.whisper.decoder import WhisperDecoderAdapter
from decoding import AssistantDraft
from decoding.kernels import graphed_step
from decoding.kernels.graphed_step import MAX_SETS, MAX_WIDTH, captured_by
from decoding.kernels.products import reference_kernels
from decoding.beam import BeamOptions, beam_search_batch
from decoding.engine import GenerationOptions, generate_batch
from decoding.filters import SamplingOptions
from decoding.kv_cache import causal_mask
from tests.test_ct2 import tiny_whisper

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [50258, 50259, 50360, 50364]


class _Recording(TorchDispatchMode):
    """`run`'s operations as it ran once, run again over the same tensors by `__call__`, each result copied where
    the recorded one lies (a CUDA graph's fixed addresses); results that are their inputs' memory (views,
    in-place operations) are left where they are."""

    def __init__(self, run: Callable[[], None]) -> None:
        super().__init__()
        self.operations: list[tuple[Any, tuple, dict, list[tuple[torch.Tensor, bool]]]] = []
        with self:
            run()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        outputs = [(t, _storage(t) not in inputs) for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.operations.append((func, args, kwargs, outputs))
        return result

    def __call__(self) -> None:
        for func, args, kwargs, outputs in self.operations:
            fresh = [t for t in tree_flatten(func(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
            for (recorded, own), value in zip(outputs, fresh):
                if own:
                    recorded.copy_(value)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else id(t)


@contextlib.contextmanager
def replayed_eagerly() -> Iterator[None]:
    """Within it, adapters built on a CPU use PyTorch's own kernels (as on a GPU) and step over the graphs' buffers
    too, each step's operations recorded at capture and run again at each replay."""
    with captured_by(_Recording), reference_kernels():
        yield


def _outputs(seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 1500, 64, generator=torch.Generator().manual_seed(seed))


def _graphed(model: torch.nn.Module, encoder_output: torch.Tensor) -> WhisperDecoderAdapter:
    with replayed_eagerly():
        adapter = WhisperDecoderAdapter(model, encoder_output)
    assert adapter.graphs is not None
    return adapter


def _captured(model: torch.nn.Module) -> set[tuple[int, int, bool]]:
    """(batch size, width, masked) of every step captured for `model`."""
    steps = graphed_step._STEPS[model]
    return {(b.batch_size, *key) for b in steps.buffers for key in b.steps}


def test_graphs_apply_on_a_gpu_or_when_asked_and_never_to_a_screened_head() -> None:
    model = tiny_whisper(seed=0)
    assert WhisperDecoderAdapter(model, _outputs(0)).graphs is None  # a CPU
    adapter = _graphed(model, _outputs(0))
    screened = adapter.screened([50257])
    assert screened is adapter or screened.graphs is None


@pytest.mark.parametrize("seed", range(6))
def test_a_replayed_step_gives_the_layers_logits_at_every_width_and_slot(seed: int) -> None:
    model = tiny_whisper(seed=seed)
    encoder_output = _outputs(seed)
    plain, graphed = WhisperDecoderAdapter(model, encoder_output), _graphed(model, encoder_output)
    plain_cache, graphed_cache = plain.new_cache(), graphed.new_cache()
    ids = torch.tensor([PROMPT])
    plain.forward(ids, plain_cache, 1)
    graphed.forward(ids, graphed_cache, 1)
    generator = torch.Generator().manual_seed(seed)
    for width in [1, 2, MAX_WIDTH, 1, 5, 1, 3, 1]:
        ids = torch.randint(0, 50000, (1, width), generator=generator)
        expected = plain.forward(ids, plain_cache, width)
        got = graphed.forward(ids, graphed_cache, width)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
        # A rewind, as a rejected draft makes: the next step writes over the dropped slots.
        plain_cache.crop(plain_cache.length - 1)
        graphed.crop(graphed_cache, graphed_cache.length - 1)
    assert {(1, w, False) for w in (1, 2, MAX_WIDTH, 5, 3)} <= _captured(model)
    assert graphed.graphs.enabled


@pytest.mark.parametrize("seed", range(8))
def test_assisted_and_plain_greedy_over_graphs_give_the_words_without_them(seed: int) -> None:
    model, other = tiny_whisper(seed=seed), tiny_whisper(seed=100 + seed)
    encoder_output = _outputs(seed)
    options = GenerationOptions(max_new_tokens=40, num_assistant_tokens=4)
    reference, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [PROMPT], options)
    plain, = generate_batch(_graphed(model, encoder_output), [PROMPT], options)
    assert plain.tokens == reference.tokens
    for assistant in (model, other):  # always agrees (two caches of one model at once), almost never agrees
        assisted, = generate_batch(_graphed(model, encoder_output), [PROMPT], options,
                                   AssistantDraft(_graphed(assistant, encoder_output)))
        assert assisted.tokens == reference.tokens
    assert {(1, 1, False), (1, 5, False)} <= _captured(model)


@pytest.mark.parametrize("seed", range(4))
def test_a_ragged_batch_replays_masked_steps_and_keeps_each_rows_words(seed: int) -> None:
    """Rows of different lengths drafting their own amounts (masked steps), rows leaving the batch (moved to the
    front of the same buffers), each row's words those it gets alone without graphs."""
    model, other = tiny_whisper(seed=seed), tiny_whisper(seed=200 + seed)
    outputs = _outputs(seed, batch=3)
    prompts = [PROMPT, PROMPT[:3], PROMPT + [440, 1000]]
    alone = [generate_batch(WhisperDecoderAdapter(model, outputs[i:i + 1]), [p],
                            GenerationOptions(max_new_tokens=12 + 9 * i))[0].tokens for i, p in enumerate(prompts)]
    for i in range(3):
        together = generate_batch(_graphed(model, outputs), prompts, GenerationOptions(max_new_tokens=12 + 9 * i),
                                  AssistantDraft(_graphed(other, outputs)))
        assert together[i].tokens == alone[i]
    captured = _captured(model)
    assert any(masked for _, _, masked in captured)
    assert graphed_step._STEPS[model].enabled


def test_beams_widening_and_narrowing_the_batch_move_between_buffers() -> None:
    model = tiny_whisper(seed=5)
    outputs = _outputs(5, batch=2)
    prompts = [PROMPT, PROMPT[:3]]
    options = GenerationOptions(max_new_tokens=15)
    expected = beam_search_batch(WhisperDecoderAdapter(model, outputs), prompts, options, BeamOptions(3))
    got = beam_search_batch(_graphed(model, outputs), prompts, options, BeamOptions(3))
    assert [[c.tokens for c in r.candidates] for r in got] == [[c.tokens for c in r.candidates] for r in expected]
    assert {6} <= {batch for batch, _, _ in _captured(model)}


def test_sampling_over_graphs_draws_what_it_draws_without_them() -> None:
    """A draft's logits are kept while it drafts on: each replay's logits must be a copy, not the buffer."""
    model, other = tiny_whisper(seed=7), tiny_whisper(seed=8)
    encoder_output = _outputs(7)
    options = GenerationOptions(max_new_tokens=30, sampling=SamplingOptions(temperature=1.0), seed=3,
                                schedule="constant", num_assistant_tokens=3)
    expected, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [PROMPT], options,
                               AssistantDraft(WhisperDecoderAdapter(other, encoder_output)))
    got, = generate_batch(_graphed(model, encoder_output), [PROMPT], options,
                          AssistantDraft(_graphed(other, encoder_output)))
    assert got.tokens == expected.tokens


def test_a_new_window_replays_the_same_graphs_over_its_own_encoder_output() -> None:
    model = tiny_whisper(seed=9)
    options = GenerationOptions(max_new_tokens=20)
    for window in range(3):
        encoder_output = _outputs(50 + window)
        expected, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [PROMPT], options)
        got, = generate_batch(_graphed(model, encoder_output), [PROMPT], options)
        assert got.tokens == expected.tokens
    steps = graphed_step._STEPS[model]
    assert len(steps.buffers) == 1  # each window's cache took the buffers its predecessor left


def test_buffers_are_lent_to_at_most_max_sets_live_caches() -> None:
    model = tiny_whisper(seed=1)
    adapter = _graphed(model, _outputs(1))
    caches = [adapter.new_cache(1) for _ in range(MAX_SETS + 1)]
    lent = graphed_step._STEPS[model].buffers
    assert [c.keys.data_ptr() for c in caches[:MAX_SETS]] == [b.keys.data_ptr() for b in lent]
    assert all(caches[-1].keys.data_ptr() != b.keys.data_ptr() for b in lent)  # its own, stepped through the layers
    plain = WhisperDecoderAdapter(model, _outputs(1))
    plain_cache = plain.new_cache(1)
    for ids in (torch.tensor([PROMPT]), torch.tensor([[300]]), torch.tensor([[301, 302]])):
        expected = plain.forward(ids, plain_cache, ids.shape[1])
        for cache in caches:
            torch.testing.assert_close(adapter.forward(ids, cache, ids.shape[1]), expected, rtol=0, atol=1e-4)
    del caches
    gc.collect()
    assert adapter.new_cache(1).keys.data_ptr() == lent[0].keys.data_ptr()


def test_a_cache_takes_a_free_set_up_to_twice_its_rows_and_a_full_model_drops_a_free_one() -> None:
    model = tiny_whisper(seed=6)
    outputs = _outputs(6, batch=4)
    steps = graphed_step._STEPS
    four = _graphed(model, outputs).new_cache(4)
    del four
    three = _graphed(model, outputs[:3]).new_cache(3)
    assert [b.batch_size for b in steps[model].buffers] == [4]  # three rows at the front of four
    assert three.keys.shape[1] == 3
    one = _graphed(model, outputs[:1]).new_cache(1)  # not a set of four for one row: its own
    two = _graphed(model, outputs[:2]).new_cache(2)
    assert sorted(b.batch_size for b in steps[model].buffers) == [1, 2, 4]
    del one
    gc.collect()
    kept = [_graphed(model, outputs[:n]).new_cache(n) for n in (3, 4)]  # a fourth set, then a fifth in place of 1
    assert len(steps[model].buffers) == MAX_SETS
    assert sorted(b.batch_size for b in steps[model].buffers) == [2, 3, 4, 4]
    assert all(not b.free() for b in steps[model].buffers)
    assert _graphed(model, outputs[:1]).new_cache(1).keys.data_ptr() not in {
        b.keys.data_ptr() for b in steps[model].buffers}  # every set in use: a cache of its own
    del three, two, kept


def test_a_step_that_disagrees_with_the_layers_turns_graphs_off_and_keeps_the_words(monkeypatch, caplog) -> None:
    model = tiny_whisper(seed=2)
    encoder_output = _outputs(2)
    options = GenerationOptions(max_new_tokens=25)
    expected, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [PROMPT], options)
    # A recording that misses the step's slot: each replay reads slot 1, as a graph with a baked-in slot would.
    original = graphed_step.GraphedSteps._step

    def stale(self, adapter, buffers, width, masked):
        step = original(self, adapter, buffers, width, masked)
        run = step.run

        def run_at_slot_one() -> None:
            buffers.start.fill_(1)
            run()
        step.run = run_at_slot_one
        return step

    monkeypatch.setattr(graphed_step.GraphedSteps, "_step", stale)
    with caplog.at_level(logging.WARNING, logger="decoding.kernels.graphed_step"):
        got, = generate_batch(_graphed(model, encoder_output), [PROMPT], options)
    assert got.tokens == expected.tokens
    assert not graphed_step._STEPS[model].enabled
    assert "CUDA graphs turned off" in caplog.text


def test_a_step_reading_a_host_value_replays_it_as_captured_and_graphs_turn_off(monkeypatch, caplog) -> None:
    """What a replay computes from a value read on the host at capture (here the self-attention mask, from the first
    slot as a Python int) is what it computed then, on a GPU and in the recording alike: the second checked replay,
    at the next slot, catches it."""
    model = tiny_whisper(seed=3)
    encoder_output = _outputs(3)
    options = GenerationOptions(max_new_tokens=10)
    expected, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [PROMPT], options)

    def host_read_mask(start, width, device, slots=None):  # the mask's slots counted from a host copy
        return causal_mask(int(start), width, device, slots)

    monkeypatch.setattr(graphed_step, "causal_mask", host_read_mask)
    with caplog.at_level(logging.WARNING, logger="decoding.kernels.graphed_step"):
        got, = generate_batch(_graphed(model, encoder_output), [PROMPT], options)
    assert got.tokens == expected.tokens
    assert not graphed_step._STEPS[model].enabled
    assert "differs from the layers" in caplog.text


def test_the_graphs_do_not_keep_their_model_alive() -> None:
    model = tiny_whisper(seed=4)
    generate_batch(_graphed(model, _outputs(4)), [PROMPT], GenerationOptions(max_new_tokens=5))
    assert model in graphed_step._STEPS
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


def test_turned_off_by_the_environment_there_are_no_graphs(monkeypatch) -> None:
    monkeypatch.setattr(graphed_step, "_ENABLED", False)
    with replayed_eagerly():
        assert WhisperDecoderAdapter(tiny_whisper(seed=0), _outputs(0)).graphs is None


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["none", "auto"])
def test_a_real_recording_over_graphs_has_the_words_it_has_without_them(base, spec: str) -> None:
    """base on a two-window sonnet, alone and drafted by its student (whose head covers part of the vocabulary:
    infinite logits), with every logit in float32 (a screened head takes no graph)."""
    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe
    from asr.options import TranscribeOptions
    from audio import load_audio
    from decoding.kernels.products import full_head
    from tests.conftest import evaldata

    audio = load_audio(evaldata("longform", "p001.mp3"))
    options = TranscribeOptions(language="en")
    with full_head():
        expected = transcribe(base, audio, options, make_assistant(spec, base))
        with replayed_eagerly():
            got = transcribe(base, audio, options, make_assistant(spec, base))
    assert got.text == expected.text
    assert [s.tokens for s in got.segments] == [s.tokens for s in expected.segments]
    steps = graphed_step._STEPS[base.model]
    assert steps.enabled and any(b.steps for b in steps.buffers)
