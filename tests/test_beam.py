"""Beam search and best-of: openai-whisper's rule (a plain reference written here, recomputing every step without a
cache) on tiny random Whispers, the window decoder's choice of candidate, and the command-line checks."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from asr.cli import main
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.logit_rules import whisper_filters
from asr.whisper.window import FallbackRules, WindowSettings, decode_windows
from decoding.beam import BeamOptions, beam_search_batch, rank
from decoding.drafts import AssistantDraft
from decoding.engine import GenerationOptions, generate_batch
from decoding.filters import LogitsFilter, SamplingOptions, apply_filters
from decoding.kernels.products import full_head
from tests.test_ct2 import tiny_whisper

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64
EOS = 5


class Rules:
    """Filters that depend on each beam's own context: no token right after itself, no end at the first position
    (so no candidate is empty), and the end made likelier (so that sequences end at different lengths)."""

    def __init__(self, sample_begin: int, eos_bonus: float = 1.0) -> None:
        self.sample_begin = sample_begin
        self.eos_bonus = eos_bonus

    def apply(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        first = tokens.shape[1] - logits.shape[1] + 1
        for j in range(logits.shape[1]):
            logits[0, j, tokens[0, first + j - 1]] = -torch.inf
            logits[0, j, EOS] = -torch.inf if first + j == self.sample_begin else logits[0, j, EOS] + self.eos_bonus
        return logits


def small_whisper(seed: int) -> torch.nn.Module:
    """A random Whisper over 64 tokens, its output sharpened so that candidates differ in score."""
    model = tiny_whisper(seed, vocab_size=VOCAB, pad_token_id=0, bos_token_id=0, eos_token_id=EOS,
                         decoder_start_token_id=1)
    with torch.no_grad():
        model.get_decoder().embed_tokens.weight.mul_(5.0)
    return model


def full_logits(model: torch.nn.Module, encoder_output: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The next token's `[V]` logits, recomputed over the whole sequence (no cache)."""
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=torch.tensor([tokens]), encoder_hidden_states=encoder_output)
        return model.get_output_embeddings()(hidden.last_hidden_state[:, -1]).float()[0]


def reference_beam(model, encoder_output, prompt: list[int], beam_size: int, patience: float | None, eos: int,
                   limit: int, filters: Sequence[LogitsFilter]) -> list[tuple[list[int], float]]:
    """openai-whisper's BeamSearchDecoder for one audio, step by step: (tokens without end-of-text, score) per
    candidate, in its order."""
    max_candidates = round(beam_size * (patience or 1.0))
    beams = [(list(prompt), np.float32(0.0))] * beam_size  # openai-whisper starts with beam_size copies
    finished: dict[tuple[int, ...], float] = {}
    for _ in range(limit):
        scores: dict[tuple[int, ...], np.float32] = {}
        for tokens, total in beams:
            logits = full_logits(model, encoder_output, tokens)[None, None]
            logits = apply_filters(filters, torch.tensor([tokens]), logits)[0, 0]
            logprobs = torch.log_softmax(logits, dim=-1)
            values, ids = logprobs.topk(beam_size + 1)
            for value, token in zip(values.tolist(), ids.tolist()):
                scores[tuple(tokens + [token])] = np.float32(total + np.float32(value))
        beams = []
        for sequence in sorted(scores, key=scores.get, reverse=True):
            if sequence[-1] == eos:
                if len(finished) < max_candidates:
                    finished[sequence] = scores[sequence]
            else:
                beams.append((list(sequence), scores[sequence]))
                if len(beams) == beam_size:
                    break
        if len(finished) >= max_candidates:
            break
    if len(finished) < beam_size:
        for j in np.argsort(np.array([s for _, s in beams], dtype=np.float32))[::-1]:
            finished[tuple(beams[j][0] + [eos])] = beams[j][1]
            if len(finished) >= beam_size:
                break
    start = len(prompt)
    return [(list(sequence[start:sequence.index(eos, start)]), float(score)) for sequence, score in finished.items()]


def reference_best(candidates: list[tuple[list[int], float]], length_penalty: float | None) -> int:
    """openai-whisper's MaximumLikelihoodRanker, as written there."""
    scores = []
    for tokens, logprob in candidates:
        penalty = len(tokens) if length_penalty is None else ((5 + len(tokens)) / 6) ** length_penalty
        scores.append(logprob / penalty)
    return int(np.argmax(scores))


def case(seed: int, prompt_length: int = 3) -> tuple[torch.nn.Module, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(100 + seed)
    model = small_whisper(seed)
    encoder_output = torch.randn(1, 12, model.config.d_model, generator=g)
    prompt = torch.randint(6, VOCAB, (prompt_length,), generator=g).tolist()
    return model, encoder_output, prompt


LIMIT = 10


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size,patience", [(2, None), (3, None), (4, 0.5), (3, 2.0)])
def test_beam_search_matches_the_reference(seed: int, beam_size: int, patience: float | None) -> None:
    model, encoder_output, prompt = case(seed)
    options = GenerationOptions(max_new_tokens=LIMIT, eos_token_ids=(EOS,), prompt_logits_at=0)
    filters = [Rules(len(prompt))]
    result, = beam_search_batch(WhisperDecoderAdapter(model, encoder_output), [prompt], options,
                                BeamOptions(beam_size, patience), [filters])
    expected = reference_beam(model, encoder_output, prompt, beam_size, patience, EOS, LIMIT, filters)
    assert [c.tokens for c in result.candidates] == [tokens for tokens, _ in expected]
    assert [c.sum_logprob for c in result.candidates] == pytest.approx([s for _, s in expected], rel=1e-5)
    assert len(result.candidates) >= beam_size and all(c.tokens for c in result.candidates)
    for length_penalty in (None, 0.0, 0.6, 1.0):
        best = result.best(length_penalty)
        assert best is result.candidates[reference_best(expected, length_penalty)]
    # The no-speech position's logits: the model's at the prompt's first token.
    assert torch.allclose(result.prompt_logits, full_logits(model, encoder_output, prompt[:1]), atol=1e-4)


def test_the_cases_cover_finished_and_unfinished_candidates_and_patience() -> None:
    """The parametrised cases above are not all of one kind: some sequences end, some reach the limit, and
    patience changes the result."""
    finished, unfinished, changed, not_greedy = 0, 0, 0, 0
    options = GenerationOptions(max_new_tokens=LIMIT, eos_token_ids=(EOS,))
    for seed in range(4):
        model, encoder_output, prompt = case(seed)
        greedy, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [prompt], options, None,
                                 [[Rules(len(prompt))]])
        found = {}
        for patience in (None, 2.0):
            result, = beam_search_batch(WhisperDecoderAdapter(model, encoder_output), [prompt], options,
                                        BeamOptions(3, patience), [[Rules(len(prompt))]])
            finished += sum(c.finished for c in result.candidates)
            unfinished += sum(not c.finished for c in result.candidates)
            found[patience] = [c.tokens for c in result.candidates]
            not_greedy += result.best().tokens != [t for t in greedy.tokens if t != EOS]
        changed += found[None] != found[2.0]
    assert finished and unfinished and changed and not_greedy


def test_a_batch_of_prompts_gives_each_its_own_search() -> None:
    """Prompts of different lengths (a ragged batch) and the beams' row copies in one cache."""
    model, encoder_output, _ = case(7)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(6, VOCAB, (n,), generator=g).tolist() for n in (1, 4, 2)]
    outputs = torch.cat([encoder_output, torch.randn(2, 12, model.config.d_model, generator=g)])
    options = GenerationOptions(max_new_tokens=LIMIT, eos_token_ids=(EOS,))
    together = beam_search_batch(WhisperDecoderAdapter(model, outputs), prompts, options, BeamOptions(3),
                                 [[Rules(len(p))] for p in prompts])
    for i, prompt in enumerate(prompts):
        alone, = beam_search_batch(WhisperDecoderAdapter(model, outputs[i:i + 1]), [prompt], options,
                                   BeamOptions(3), [[Rules(len(prompt))]])
        assert [c.tokens for c in together[i].candidates] == [c.tokens for c in alone.candidates]
        assert [c.sum_logprob for c in together[i].candidates] == \
            pytest.approx([c.sum_logprob for c in alone.candidates], rel=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_size_one_is_greedy(seed: int) -> None:
    model, encoder_output, prompt = case(seed)
    options = GenerationOptions(max_new_tokens=LIMIT, eos_token_ids=(EOS,))
    beam, = beam_search_batch(WhisperDecoderAdapter(model, encoder_output), [prompt], options, BeamOptions(1),
                              [[Rules(len(prompt))]])
    greedy, = generate_batch(WhisperDecoderAdapter(model, encoder_output), [prompt], options, None,
                             [[Rules(len(prompt))]])
    best = beam.best()
    assert best.tokens + [EOS] * best.finished == greedy.tokens
    assert best.sum_logprob == pytest.approx(sum(greedy.logprobs), rel=1e-5)


def test_rank_is_openai_whispers_ranker() -> None:
    lengths, sums = [4, 10, 6], [-4.0, -9.0, -5.7]
    assert rank(lengths, sums) == 1  # -0.9 per token beats -1.0 and -0.95
    assert rank(lengths, sums, 0.0) == 0  # no penalty: the highest sum
    assert rank([2, 2], [-1.0, -1.0]) == 0  # the first of equals


@pytest.mark.parametrize("values", [{"beam_size": 0}, {"beam_size": 2, "patience": 0.0},
                                    {"beam_size": 2, "patience": 0.2}])
def test_bad_beam_options_are_refused(values: dict) -> None:
    with pytest.raises(ValueError):
        BeamOptions(**values)


# Windows: the WindowResult comes from the chosen candidate.


@pytest.fixture(scope="module")
def tiny_bundle(tiny_whisper_folder: Path):
    from asr.models.registry import load_model

    return load_model(str(tiny_whisper_folder))


def window_settings(bundle, temperatures: tuple[float, ...], **search) -> WindowSettings:
    rules = FallbackRules(temperatures, None, None, None)
    return WindowSettings(rules, bundle.special, bundle.tokenizer.decode, 8, "heuristic", 5, **search)


def window_case(bundle, seed: int) -> tuple[torch.Tensor, list[int], list, int]:
    """A random encoder output, the English transcription prompt, its filters, and where <|startoftranscript|> is."""
    special = bundle.special
    g = torch.Generator().manual_seed(seed)
    encoder_output = torch.randn(1, 30, bundle.model.config.d_model, generator=g)
    prompt, sot_index = special.prompt([], "en", "transcribe", True)
    return encoder_output, prompt, whisper_filters(special, len(prompt), True), sot_index - len(prompt)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("beam_size,length_penalty", [(2, None), (3, 0.5)])
def test_a_beam_searched_window_is_the_references_best(tiny_bundle, seed: int, beam_size: int,
                                                       length_penalty: float | None) -> None:
    """Whisper's timestamp rules and suppressed tokens on every beam; avg_logprob and no-speech of the best."""
    encoder_output, prompt, filters, sot_from_end = window_case(tiny_bundle, seed)
    decoder = WhisperDecoderAdapter(tiny_bundle.model, encoder_output)
    settings = window_settings(tiny_bundle, (0.0,), beam_size=beam_size, length_penalty=length_penalty)
    (result, stats), = decode_windows(decoder, [prompt], [filters], settings, make_draft=None,
                                      sot_from_end=sot_from_end, seed=0)
    expected = reference_beam(tiny_bundle.model, encoder_output, prompt, beam_size, None, tiny_bundle.special.eot, 8,
                              filters)
    tokens, score = expected[reference_best(expected, length_penalty)]
    assert result.tokens == tokens
    assert result.tokens[0] >= tiny_bundle.special.timestamp_begin  # the timestamp rules held
    assert result.avg_logprob == pytest.approx(score / (len(tokens) + 1), rel=1e-5)
    # Greedy decoding's head in float32 throughout: screened, its probabilities are float32's only closely.
    with full_head():
        greedy, = decode_windows(decoder, [prompt], [filters], window_settings(tiny_bundle, (0.0,)),
                                 make_draft=None, sot_from_end=sot_from_end, seed=0)
    assert result.no_speech_prob == pytest.approx(greedy[0].no_speech_prob)
    assert stats.model_forward_passes > 0



def sampled_windows(bundle, seed: int, best_of: int, assisted: bool):
    """decode_windows at temperature 1 with best_of samples, and the same samples made directly."""
    encoder_output, prompt, filters, sot_from_end = window_case(bundle, 0)
    settings = window_settings(bundle, (1.0,), best_of=best_of)

    def make_draft(rows: list[int]) -> AssistantDraft:
        # The model drafting for itself: speculative sampling keeps the model's distribution whatever drafts.
        return AssistantDraft(WhisperDecoderAdapter(bundle.model, encoder_output).rows(rows),
                              row_filters=[filters for _ in rows])

    draft = make_draft if assisted else None
    (result, stats), = decode_windows(WhisperDecoderAdapter(bundle.model, encoder_output), [prompt], [filters],
                                      settings, make_draft=draft, sot_from_end=sot_from_end, seed=seed)
    options = GenerationOptions(max_new_tokens=8, eos_token_ids=(bundle.special.eot,), max_length=448,
                                sampling=SamplingOptions(temperature=1.0), seed=seed, prompt_logits_at=sot_from_end)
    samples = generate_batch(WhisperDecoderAdapter(bundle.model, encoder_output).rows([0] * best_of),
                             [prompt] * best_of, options, make_draft([0] * best_of) if assisted else None,
                             [filters] * best_of)
    return result, stats, samples


@pytest.mark.parametrize("assisted", [False, True])
def test_best_of_keeps_the_most_likely_sample(tiny_bundle, assisted: bool) -> None:
    chosen = set()
    for seed in range(4):
        result, stats, samples = sampled_windows(tiny_bundle, seed, 3, assisted)
        texts = [[t for t in s.tokens if t != tiny_bundle.special.eot] for s in samples]
        assert len({tuple(t) for t in texts}) == 3  # independent samples
        scores = [sum(s.logprobs) / len(t) for s, t in zip(samples, texts)]
        best = scores.index(max(scores))
        chosen.add(best)
        assert result.tokens == texts[best]
        assert result.avg_logprob == pytest.approx(sum(samples[best].logprobs) / (len(texts[best]) + 1))
        assert result.temperature == 1.0
        assert stats.generated_tokens == sum(len(s.tokens) for s in samples)
        assert (stats.drafted_tokens > 0) == assisted
    assert chosen != {0}  # not simply the first sample


def test_best_of_one_is_one_sample(tiny_bundle) -> None:
    result, _, samples = sampled_windows(tiny_bundle, 3, 1, False)
    assert result.tokens == [t for t in samples[0].tokens if t != tiny_bundle.special.eot]


# The command line and the Python API.


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


def one_line_error(result, *words: str) -> None:
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and all(word in errors[0] for word in words), result.output


@pytest.mark.parametrize("args,words", [
    (["--beam-size", "0"], ["beam size", "between 1 and 32"]),
    (["--beam-size", "1000"], ["beam size", "between 1 and 32", "1000"]),
    (["--best-of", "500"], ["best of", "between 1 and 32", "500"]),
    (["--beam-size", "5", "--patience", "-1"], ["patience", "> 0"]),
    (["--beam-size", "5", "--patience", "inf"], ["patience", "at most 100"]),
    (["--beam-size", "5", "--patience", "1e308"], ["patience", "at most 100"]),
    (["--patience", "2"], ["patience", "beam size"]),
    (["--beam-size", "5", "--length-penalty", "2"], ["length penalty"]),
    (["--best-of", "0"], ["best of", "between 1 and 32"]),
    (["--beam-size", "5", "--assistant", "self:int8"], ["--beam-size 5", "alone", "self:int8"]),
    (["--beam-size", "2", "--assistant", "tiny.en"], ["alone", "tiny.en"]),
])
def test_bad_search_options_are_one_line_errors(tmp_path: Path, args: list[str], words: list[str]) -> None:
    # Refused before any model is loaded (the model named does not exist).
    missing = str(tmp_path / "no-model")
    one_line_error(run_cli("transcribe", "clip.wav", "--model", missing, *args), *words)
    one_line_error(run_cli("batch", str(tmp_path), "-o", str(tmp_path / "out.jsonl"), "--model", missing, *args),
                   *words)


def test_beam_search_with_assistant_auto_decodes_alone(tmp_path: Path) -> None:
    from asr.cli.options import assistant_to_load
    from asr.options import TranscribeOptions

    assert assistant_to_load("auto", TranscribeOptions(beam_size=5, best_of=5)) == "none"
    assert assistant_to_load("self:int8", TranscribeOptions(beam_size=1, best_of=5)) == "self:int8"  # greedy at 0
    assert assistant_to_load("self:int8", TranscribeOptions(best_of=3)) == "self:int8"


def test_the_api_refuses_an_assistant_with_beam_search(tiny_bundle) -> None:
    from asr.transcription import transcribe
    from asr.options import TranscribeOptions

    with pytest.raises(ValueError, match="alone"):
        transcribe(tiny_bundle, np.zeros(16000, dtype=np.float32), TranscribeOptions(beam_size=2), assistant=object())
    assert TranscribeOptions(beam_size=1, best_of=5).beam_search is False
    assert TranscribeOptions().beam_size is None and TranscribeOptions().best_of is None  # greedy by default


def test_transcribe_beam_searches_with_assistant_auto_decoding_alone(tiny_whisper_folder: Path, tiny_bundle) -> None:
    import json

    from asr.transcription import transcribe
    from asr.options import TranscribeOptions
    from tests.conftest import SAMPLES

    clip = str(SAMPLES / "numbers.flac")
    args = ["transcribe", clip, "--model", str(tiny_whisper_folder), "--language", "en", "-f", "json", "-q",
            "--temperature", "0", "--threads", "1", "--beam-size", "2"]  # --assistant auto, the default
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == ""  # the default's choice, not a warning
    assert json.loads(result.stdout)["stats"]["assistant"] == "none"
    tokens = [s["tokens"] for s in json.loads(result.stdout)["segments"]]
    options = TranscribeOptions(language="en", temperatures=(0.0,), beam_size=2)
    assert tokens == [s.tokens for s in transcribe(tiny_bundle, clip, options).segments]
    greedy = transcribe(tiny_bundle, clip, TranscribeOptions(language="en", temperatures=(0.0,)))
    assert tokens != [s.tokens for s in greedy.segments]
