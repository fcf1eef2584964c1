"""decoding.kernels.native: the row-by-row products of decoder steps, compiled here, and how
decoding.kernels.products routes to them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decoding.kernels import native, products

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler to build decoding.kernels.native")


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("seed", range(12))
def test_products_match_float64(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 6, (1,), generator=generator))
    out_features = int(torch.randint(1, 300, (1,), generator=generator))
    in_features = [7, 64, 100, 384, 512, 777][seed % 6]  # with and without a remainder past multiples of 64
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if seed % 2 else None
    got = native.rowdot(x, weight, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    expected = _reference(x, weight, bias)
    # float32 sums of in_features products: within a few units of the last place of the sum of magnitudes.
    scale = (x.abs().double() @ weight.abs().double().T) + (0 if bias is None else bias.abs().double())
    assert ((got.double() - expected).abs() <= 4 * in_features * 2.0 ** -24 * scale + 1e-30).all()


def _operands(kind: str, rows: int, out_features: int, in_features: int, seed: int):
    """Random rows, a weight of `kind` (int8 with a scale per output row), a bias: x, weight, bias, scale."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    scale = None
    if kind == "int8":
        weight, scale = torch.randint(-127, 128, weight.shape, generator=generator, dtype=torch.int8), \
            torch.rand(out_features, generator=generator)
    elif kind == "bfloat16":
        weight = weight.to(torch.bfloat16)
    return x, weight, torch.randn(out_features, generator=generator), scale


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("rows, out_features, in_features", [(4, 2048, 512), (11, 2051, 777), (21, 37, 100),
                                                             (3, 16, 64), (6, 48, 7)])
def test_each_row_is_the_same_alone_with_others_and_with_any_threads(kind: str, rows: int, out_features: int,
                                                                     in_features: int) -> None:
    # One row takes each weight row in turn, more take tiles of 16 weight rows (and the weight rows past the
    # last tile one by one): every row gets the same bits either way.
    x, weight, bias, scale = _operands(kind, rows, out_features, in_features, seed=rows)
    together = native.rowdot(x, weight, bias, scale)
    for i in range(rows):
        assert torch.equal(native.rowdot(x[i:i + 1], weight, bias, scale)[0], together[i])
    assert torch.equal(native.rowdot(x[1:3], weight, bias, scale), together[1:3])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(native.rowdot(x, weight, bias, scale), together)
    finally:
        torch.set_num_threads(threads)


def test_a_bfloat16_weight_is_the_float32_product_of_its_exact_widening() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 512, generator=generator)
    low = torch.randn(1000, 512, generator=generator).to(torch.bfloat16)
    assert torch.equal(native.rowdot(x, low), native.rowdot(x, low.float()))


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("in_features", [7, 512, 777])
def test_an_int8_weight_is_its_scaled_widening(rows: int, in_features: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    quantized = torch.randint(-127, 128, (300, in_features), generator=generator, dtype=torch.int8)
    scale = torch.rand(300, generator=generator) / 64
    bias = torch.randn(300, generator=generator)
    got = native.rowdot(x, quantized, bias, scale)
    # The same sums as over the float32 widening (the same order), each then scaled.
    assert torch.equal(native.rowdot(x, quantized, None, scale), native.rowdot(x, quantized.float()) * scale)
    expected = _reference(x, quantized.double() * scale.double()[:, None], bias)
    magnitude = (x.abs().double() @ quantized.abs().double().T) * scale.double() + bias.abs().double()
    assert ((got.double() - expected).abs() <= 4 * in_features * 2.0 ** -24 * magnitude + 1e-30).all()
    for i in range(rows):  # each row on its own
        assert torch.equal(native.rowdot(x[i:i + 1], quantized, bias, scale)[0], got[i])


def test_int8_weights_and_scales_come_together() -> None:
    with pytest.raises(ValueError, match="scales"):
        native.rowdot(torch.randn(1, 8), torch.zeros(4, 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="scales"):
        native.rowdot(torch.randn(1, 8), torch.zeros(4, 8), scale=torch.ones(4))


def test_bfloat16_rows_are_widened_exactly() -> None:
    x = torch.randn(2, 64).to(torch.bfloat16)
    weight = torch.randn(16, 64)
    assert torch.equal(native.rowdot(x, weight), native.rowdot(x.float(), weight))


def test_float32_int8_linears_take_the_native_kernel_and_bfloat16_ones_keep_pytorchs() -> None:
    from decoding.kernels.int8 import Int8Linear

    dense = torch.nn.Linear(512, 300)
    x = torch.randn(1, 3, 512)
    draft_copy, model_copy = Int8Linear(dense, torch.float32), Int8Linear(dense, torch.bfloat16)
    expected = native.rowdot(x, draft_copy.weight, draft_copy.bias, draft_copy.scale)
    assert torch.equal(draft_copy(x), expected)
    with products.onednn_only():
        pytorch = draft_copy(x)
    assert not torch.equal(pytorch, expected) and torch.allclose(pytorch, expected, atol=1e-4)
    low = model_copy(x.bfloat16())
    assert low.dtype == torch.bfloat16
    with products.onednn_only():
        assert torch.equal(model_copy(x.bfloat16()), low)


def test_batched_shapes_keep_their_leading_dimensions() -> None:
    x = torch.randn(1, 2, 64)
    weight = torch.randn(10, 64)
    assert native.rowdot(x, weight).shape == (1, 2, 10)
    with pytest.raises(ValueError, match="input of 64 features for a weight of 32"):
        native.rowdot(x, torch.randn(10, 32))


def test_linear_routes_few_float32_rows_to_native_and_the_rest_to_onednn() -> None:
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(300, 512, generator=generator), torch.randn(300, generator=generator)
    few, many = torch.randn(1, 1, 512, generator=generator), torch.randn(1, 40, 512, generator=generator)
    product = products.linear(weight, bias)
    assert torch.equal(product(few), native.rowdot(few, weight, bias))
    torch.testing.assert_close(product(many), F.linear(many, weight, bias), rtol=1e-5, atol=1e-4)
    with products.onednn_only():
        onednn = products.linear(weight, bias)
        assert not products.native_rows_allowed(weight)
    torch.testing.assert_close(onednn(few), F.linear(few, weight, bias), rtol=1e-5, atol=1e-4)
    with products.reference_kernels():
        assert torch.equal(products.linear(weight, bias)(few), F.linear(few, weight, bias))


def test_onednn_linear_modules_take_the_native_path_for_a_step() -> None:
    layer = torch.nn.Linear(512, 256)
    products.use_onednn(layer)
    x = torch.randn(1, 512)
    with torch.inference_mode():
        assert torch.equal(layer(x), native.rowdot(x, layer.weight, layer.bias))
        with products.onednn_only():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_without_a_compiler_the_products_stay_onednn(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_compiler", lambda: None)
    native.library.cache_clear()
    try:
        assert native.library() is None
        assert not products.native_rows_allowed()
        weight, x = torch.randn(20, 64), torch.randn(1, 64)
        torch.testing.assert_close(products.linear(weight, None)(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
        assert not list(tmp_path.iterdir())
    finally:
        native.library.cache_clear()


def test_the_library_is_built_once_into_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library() is not None
        built = list((tmp_path / "native").glob("rowdot-*.so"))
        assert len(built) == 1 and not list((tmp_path / "native").glob("*.tmp"))
        stamp = built[0].stat().st_mtime_ns
        native.library.cache_clear()
        assert native.library() is not None and built[0].stat().st_mtime_ns == stamp
    finally:
        native.library.cache_clear()


def test_a_failed_build_is_one_warning_and_onednn(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "SOURCES", (tmp_path / "missing.c",))
    (tmp_path / "missing.c").write_text("this is not C\n")
    native.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="decoding.kernels.native"):
            assert native.library() is None
        assert "native kernels unavailable" in caplog.text
        assert not list((tmp_path / "native").glob("*"))
    finally:
        native.library.cache_clear()


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_attention_over_many_keys_matches_float64(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    q = torch.randn(2, 8, rows, 64, generator=generator) * 0.125
    k, v = torch.randn(2, 8, 1500, 64, generator=generator), torch.randn(2, 8, 1500, 64, generator=generator)
    expected = (q.double() @ k.double().transpose(-1, -2)).softmax(-1) @ v.double()
    got = native.attention(q, k, v)
    assert got.shape == (2, 8, rows, 64)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # Each row as it would be alone.
    assert torch.equal(native.attention(q[:, :, :1].contiguous(), k, v)[:, :, 0], got[:, :, 0])


def test_cross_attention_keeps_its_layout_and_falls_back_for_many_rows() -> None:
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(1, 8, 1500, 64, generator=generator), torch.randn(1, 8, 1500, 64, generator=generator)
    attention = products.Attention(torch.device("cpu"))
    assert attention.native
    k, v = attention.prepare(keys), attention.prepare(values, keys=False)
    for rows in (1, 4, 40):
        q = torch.randn(1, 8, rows, 64, generator=generator)
        expected = torch.nn.functional.scaled_dot_product_attention(q.double(), keys.double(), values.double())
        torch.testing.assert_close(attention(q, k, v, ready=True).double(), expected, rtol=1e-5, atol=1e-5)
    with products.onednn_only():
        assert not products.Attention(torch.device("cpu")).native
    exact = products.Attention(torch.device("cpu"), exact_rows=True)
    assert exact.native
    k, v = exact.prepare(keys.bfloat16()), exact.prepare(values.bfloat16(), keys=False)
    assert k.dtype == torch.float32 and k.shape == keys.shape
    q = torch.randn(1, 8, 40, 64, generator=generator).bfloat16()
    together = exact(q, k, v, ready=True)
    assert torch.equal(exact(q[:, :, 7:8], k, v, ready=True)[:, :, 0], together[:, :, 7])
    # The pass that fills an empty cache may take torch's products: the same call in plain and assisted decoding.
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), keys.bfloat16().double(),
                                                                values.bfloat16().double())
    with products.prompt_pass():
        prompt = exact(q, k, v, ready=True)
    torch.testing.assert_close(prompt.double(), expected, rtol=2e-2, atol=2e-2)


def test_a_float32_row_exact_self_attention_gives_each_row_its_own_bits() -> None:
    # The int8 model's self-attention over its fixed span of slots: a check of 4 rows, and each row alone.
    generator = torch.Generator().manual_seed(6)
    exact = products.Attention(torch.device("cpu"), exact_rows=True)
    keys, values = torch.randn(1, 8, 448, 64, generator=generator), torch.randn(1, 8, 448, 64, generator=generator)
    q = torch.randn(1, 8, 4, 64, generator=generator)
    from decoding.kv_cache import causal_mask

    together = exact(q, keys, values, causal_mask(60, 4, torch.device("cpu"), slots=448))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.double(), keys[:, :, :64].double(), values[:, :, :64].double(),
        attn_mask=causal_mask(60, 4, torch.device("cpu")))
    torch.testing.assert_close(together.double(), expected, rtol=1e-5, atol=1e-5)
    for row in range(4):
        alone = exact(q[:, :, row:row + 1], keys, values, causal_mask(60 + row, 1, torch.device("cpu"), slots=448))
        assert torch.equal(alone[:, :, 0], together[:, :, row])


def test_a_missing_source_is_one_warning_and_onednn(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "SOURCES", (native.SOURCES[0], tmp_path / "gone.c"))  # one of the two missing
    native.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="decoding.kernels.native"):
            assert native.library() is None
        assert "native kernels unavailable" in caplog.text
    finally:
        native.library.cache_clear()


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("rows, out_features, in_features", [(24, 512, 2048), (13, 100, 70), (7, 64, 64),
                                                             (1, 37, 130), (30, 200, 7), (2, 5, 0)])
def test_packed_products_give_each_row_its_own_bits_close_to_float64(kind: str, rows: int, out_features: int,
                                                                     in_features: int) -> None:
    # A decoder step's products over weights packed in blocks of 64 outputs (native.pack), tiles of 6 rows: any
    # row count, a last block of fewer outputs, k past multiples of 64 (or none at all).
    x, weight, bias, scale = _operands(kind, rows, out_features, in_features, seed=rows + out_features)
    packed = native.pack(weight)
    assert packed.shape == (-(-out_features // 64), in_features, 64) and packed.dtype == weight.dtype
    together = native.rowdot_packed(x, packed, out_features, bias, scale)
    for i in range(rows):
        assert torch.equal(native.rowdot_packed(x[i:i + 1], packed, out_features, bias, scale)[0], together[i])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(native.rowdot_packed(x, packed, out_features, bias, scale), together)
    finally:
        torch.set_num_threads(threads)
    widened = weight.double() * (scale.double()[:, None] if scale is not None else 1)
    expected = F.linear(x.double(), widened, bias.double())
    magnitude = x.abs().double() @ widened.abs().T + bias.abs().double()
    assert ((together.double() - expected).abs() <= 4 * (64 + in_features // 64) * 2.0 ** -24 * magnitude
            + 1e-30).all()
    with pytest.raises(ValueError, match="int8 weight needs its scales"):
        native.rowdot_packed(x, packed, out_features, bias, None if kind == "int8" else torch.ones(out_features))
    with pytest.raises(ValueError, match=f"input of {in_features + 1} features for a weight of {in_features}"):
        native.rowdot_packed(torch.ones(rows, in_features + 1), packed, out_features, bias, scale)
