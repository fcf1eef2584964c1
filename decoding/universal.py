"""Universal Assisted Generation: an assistant whose tokenizer differs from the model's.

The assistant works in its own vocabulary. Each round the model's new tokens are decoded to text and
re-encoded with the assistant's tokenizer; the assistant's drafts are decoded and re-encoded with the model's
tokenizer. Special tokens travel by meaning (their string; ids past the BPE vocabulary, such as Whisper's
timestamps, by their offset past it), never by id. Only a short window of recent text is re-tokenised: the
sequence is committed at special tokens and at word starts, where BPE merges cannot cross.

Drafts are proposals only: the model verifies each, so a poor conversion costs speed, never exactness.
(Timure et al. 2024, "Universal Assisted Generation"; transformers' AssistedCandidateGeneratorDifferentTokenizers.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.drafts import AssistantDraft, Draft
from decoding.filters import LogitsFilter, SamplingOptions

# Word-start markers of byte-level BPE (GPT-2, Whisper) and SentencePiece tokenizers.
_WORD_START = ("Ġ", "▁", " ")


class TokenBridge:
    """Converts token ids between two tokenizers through text, and special tokens by meaning."""

    def __init__(self, source: Any, target: Any) -> None:
        self.source = source
        self.target = target
        self.source_size = len(source)
        self.target_size = len(target)
        self.source_special = set(source.all_special_ids) | set(_added_ids(source))
        target_vocab = target.get_vocab()
        self._special_map: dict[int, int | None] = {
            i: target_vocab.get(source.convert_ids_to_tokens(i)) for i in self.source_special
        }

    def is_special(self, token: int) -> bool:
        """A special or added token, or an id past the vocabulary (Whisper's timestamps)."""
        return token in self.source_special or token >= self.source_size

    def special(self, token: int) -> int | None:
        """The target id with the same meaning, or None when the target has none."""
        if token >= self.source_size:
            # Ids past the vocabulary map by their offset past it (Whisper's timestamps: 0.00 s, 0.02 s, ...).
            return self.target_size + token - self.source_size
        return self._special_map.get(token)

    def text(self, tokens: Sequence[int]) -> str:
        """Decodes ordinary tokens of the source tokenizer."""
        return self.source.decode(list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(self, text: str) -> list[int]:
        """Encodes text with the target tokenizer, adding no special tokens."""
        return self.target.encode(text, add_special_tokens=False) if text else []

    def convert(self, tokens: Sequence[int]) -> list[int] | None:
        """Converts a whole sequence, text runs through text and special tokens by meaning.

        Returns:
            The target ids, or None when a special token has no counterpart.
        """
        out: list[int] = []
        run: list[int] = []
        for token in tokens:
            if not self.is_special(token):
                run.append(token)
                continue
            out += self.encode(self.text(run))
            run = []
            mapped = self.special(token)
            if mapped is None:
                return None
            out.append(mapped)
        return out + self.encode(self.text(run))

    def starts_word(self, token: int) -> bool:
        """True when the token begins with a word-start marker: BPE merges never cross the boundary before it."""
        piece = self.source.convert_ids_to_tokens(token)
        return isinstance(piece, str) and piece.startswith(_WORD_START)


def _added_ids(tokenizer: Any) -> list[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return [int(i) for i in decoder]


@dataclass
class _RowState:
    """Where one row's conversion stands."""

    prompt_len: int  # model tokens in the prompt
    committed: list[int]  # assistant ids for the prompt and the committed generated text
    committed_model: int = 0  # generated model tokens converted for good
    broken: bool = False  # a special token without counterpart: nothing more to draft
    previous: list[int] = field(default_factory=list)  # the assistant sequence of the last proposal


class CrossTokenizerDraft:
    """Drafts with an assistant of another tokenizer (Universal Assisted Generation), for every row of a batch.

    Args:
        assistant: the assistant's adapter.
        model_tokenizer: the model's tokenizer.
        assistant_tokenizer: the assistant's tokenizer.
        assistant_prompts: per row, the assistant's prompt (Whisper's start sequences differ in more than ids);
            by default each model prompt is converted like any other tokens.
        row_filters: logit filters per row, in the assistant's vocabulary (or `filters` for every row).
        window: model tokens of text kept uncommitted and re-tokenised each round.
    """

    def __init__(
        self,
        assistant: ModelAdapter,
        model_tokenizer: Any,
        assistant_tokenizer: Any,
        *,
        assistant_prompts: Sequence[Sequence[int]] | None = None,
        filters: Sequence[LogitsFilter] = (),
        row_filters: Sequence[Sequence[LogitsFilter]] | None = None,
        window: int = 8,
    ) -> None:
        self.inner = AssistantDraft(assistant, filters, row_filters=row_filters)
        self.to_assistant = TokenBridge(model_tokenizer, assistant_tokenizer)
        self.to_model = TokenBridge(assistant_tokenizer, model_tokenizer)
        self.assistant_prompts = [list(p) for p in assistant_prompts] if assistant_prompts is not None else None
        self.window = window
        self.max_length = getattr(assistant, "max_length", None)
        self.rows: list[_RowState] = []

    def begin(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        # Drafts are proposals checked as deterministic tokens (one-hot q), which keeps sampling exact;
        # greedy drafts are the likeliest to be kept. Stop tokens map through the bridge like any special token.
        mapped = (self.to_assistant.special(t) for t in stop_tokens)
        self.inner.begin(prompts, SamplingOptions(), generator, [t for t in mapped if t is not None])
        self.rows = []
        for b, prompt in enumerate(prompts):
            converted = self.assistant_prompts[b] if self.assistant_prompts else self.to_assistant.convert(prompt)
            self.rows.append(_RowState(len(prompt), list(converted or []), broken=converted is None))

    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int],
                min_confidence: float | None) -> list[Draft]:
        start = time.perf_counter()
        tails, tails_assistant, assistant_sequences, rooms = [], [], [], []
        for b, (state, tokens, k) in enumerate(zip(self.rows, sequences, max_tokens)):
            generated = list(tokens[state.prompt_len:])
            self._commit(state, generated)
            tail = generated[state.committed_model:]
            tail_assistant = self.to_assistant.encode(self.to_assistant.text(tail))
            sequence = state.committed + tail_assistant
            room = k if self.max_length is None else min(k, self.max_length - len(sequence))
            if state.broken:
                room = 0
            # The assistant keeps what it has already read, up to the first token that changed.
            self.inner.rewind(b, min(_common_prefix(state.previous, sequence), len(sequence) - 1))
            state.previous = sequence
            tails.append(tail)
            tails_assistant.append(tail_assistant)
            assistant_sequences.append(sequence)
            rooms.append(room)
        drafted = self.inner.propose(assistant_sequences, rooms, min_confidence)
        share = (time.perf_counter() - start) / max(len(sequences), 1)
        return [Draft(self._to_model(tail, tail_assistant, d.tokens)[: max(k, 0)], None, d.forward_passes, share)
                for tail, tail_assistant, d, k in zip(tails, tails_assistant, drafted, max_tokens)]

    def update(self, sequences: Sequence[Sequence[int]], num_accepted: Sequence[int]) -> None:
        pass  # the next proposal re-aligns from the sequences themselves

    def select(self, rows: Sequence[int]) -> None:
        self.rows = [self.rows[r] for r in rows]
        self.inner.select(rows)

    def _commit(self, state: _RowState, generated: list[int]) -> None:
        """Moves the committed point past special tokens and past text older than the window."""
        bridge = self.to_assistant
        position = state.committed_model
        while not state.broken and position < len(generated):
            run_end = position
            while run_end < len(generated) and not bridge.is_special(generated[run_end]):
                run_end += 1
            if run_end == len(generated):
                # Trailing text: commit up to a word start, leaving about `window` tokens to re-tokenise.
                cut = next((i for i in range(len(generated) - self.window, position, -1)
                            if bridge.starts_word(generated[i])), position)
                state.committed += bridge.encode(bridge.text(generated[position:cut]))
                position = cut
                break
            mapped = bridge.special(generated[run_end])
            state.committed += bridge.encode(bridge.text(generated[position:run_end]))
            if mapped is None:
                state.broken = True
            else:
                state.committed.append(mapped)
            position = run_end + 1
        state.committed_model = position

    def _to_model(self, tail: list[int], tail_assistant: list[int], drafts: list[int]) -> list[int]:
        """The assistant's drafts as model tokens that extend the model's sequence exactly, or fewer."""
        bridge = self.to_model
        first_special = next((i for i, t in enumerate(drafts) if bridge.is_special(t)), len(drafts))
        # Re-encode the uncommitted tail with the first text run so merges across the boundary come out right;
        # an incomplete UTF-8 character at the end is left for the next round.
        text = bridge.text(tail_assistant + drafts[:first_special]).rstrip("\ufffd")
        encoded = bridge.encode(text)
        if encoded[: len(tail)] != tail:
            return []
        out = encoded[len(tail):]
        run: list[int] = []
        for token in drafts[first_special:]:
            if not bridge.is_special(token):
                run.append(token)
                continue
            out += bridge.encode(bridge.text(run).rstrip("\ufffd"))
            run = []
            mapped = bridge.special(token)
            if mapped is None:
                return out
            out.append(mapped)
        return out + bridge.encode(bridge.text(run).rstrip("\ufffd"))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
