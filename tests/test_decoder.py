"""The Whisper decoder adapter against transformers' own decoder forward, on the real base model."""

from __future__ import annotations

import torch

from asr.decoder import WhisperDecoderAdapter, encode
from audio import load_audio
from audio.features import log_mel, pad_or_trim
from tests.conftest import evaldata


class _TransformersDecoder:
    """transformers' own decoder forward with its own cache, fed the same chunks as the adapter."""

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor) -> None:
        from transformers import DynamicCache, EncoderDecoderCache

        self.model, self.encoder_output = model, encoder_output
        self.cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))

    @torch.inference_mode()
    def forward(self, ids: list[int]) -> torch.Tensor:
        hidden = self.model.get_decoder()(input_ids=torch.tensor([ids]), encoder_hidden_states=self.encoder_output,
                                          cache=self.cache, use_cache=True).last_hidden_state
        return self.model.get_output_embeddings()(hidden)[0]

    def crop(self, length: int) -> None:
        self.cache.crop(length - self.cache.get_seq_length())


def test_the_adapter_gives_transformers_logits_bit_for_bit(base) -> None:
    model, special = base.model, base.special
    audio = load_audio(evaldata("clips", "jfk.flac"))
    encoder_output = encode(model, log_mel(pad_or_trim(audio), base.n_mels))
    adapter = WhisperDecoderAdapter(model, encoder_output)
    cache = adapter.new_cache(1)
    prompt = [special.sot, special.languages["en"], special.transcribe, special.no_timestamps]
    tokens = list(prompt)
    logits = [adapter.forward(torch.tensor([prompt]), cache, len(prompt))[0]]
    for _ in range(8):  # one token per pass, greedily
        tokens.append(int(logits[-1][-1].argmax()))
        logits.append(adapter.forward(torch.tensor([tokens[-1:]]), cache, 1)[0])
    stepwise = torch.cat(logits)[:-1]
    # Rolled back to after the prompt, then five tokens checked in one pass (as when verifying drafts).
    adapter.crop(cache, len(prompt) + 2)
    wide = adapter.forward(torch.tensor([tokens[len(prompt) + 2: len(prompt) + 7]]), cache, 5)[0]

    reference = _TransformersDecoder(model, encoder_output)
    expected = [reference.forward(prompt)] + [reference.forward([t]) for t in tokens[len(prompt):-1]]
    reference.crop(len(prompt) + 2)
    expected_wide = reference.forward(tokens[len(prompt) + 2: len(prompt) + 7])

    assert base.tokenizer.decode(tokens[len(prompt):]).strip().startswith("And so my fellow Americans")
    # Different cache layouts, same arithmetic: the same bits, not merely close ones.
    assert torch.equal(stepwise, torch.cat(expected))
    assert torch.equal(wide, expected_wide)
