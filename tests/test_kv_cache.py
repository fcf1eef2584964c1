"""`StaticKVCache.select`: rows kept, reordered or repeated hold exactly the slots they held, however chosen."""

from __future__ import annotations

import pytest
import torch

from decoding.kv_cache import StaticKVCache


def _filled(seed: int, batch: int = 5, length: int = 7) -> StaticKVCache:
    generator = torch.Generator().manual_seed(seed)
    cache = StaticKVCache.empty(3, batch, 2, 4, 12, torch.float32, torch.device("cpu"))
    cache.keys[:, :, :, :length] = torch.randn(3, batch, 2, length, 4, generator=generator)
    cache.values[:, :, :, :length] = torch.randn(3, batch, 2, length, 4, generator=generator)
    cache.length = length
    return cache


@pytest.mark.parametrize("choices", [
    [[0, 2, 4], [1, 2], [0]],  # a batch whose rows finish, kept in order: moved within the buffers
    [[1, 1, 0, 4, 4], [4, 3, 2, 1, 0], [0, 0, 0, 0, 0]],  # beams reordered and repeated: gathered
    [[4, 3, 2, 1, 0], [0, 1, 3], [2, 2, 0], [1]],  # both kinds in turn
])
def test_select_keeps_each_chosen_rows_filled_slots(choices: list[list[int]]) -> None:
    cache = _filled(len(choices))
    expected = (cache.keys.clone(), cache.values.clone())
    for rows in choices:
        index = torch.tensor(rows)
        cache.select(index)
        expected = (expected[0][:, index], expected[1][:, index])
        for got, want in zip((cache.keys, cache.values), expected):
            assert got.shape == want.shape and got.is_contiguous()
            assert torch.equal(got[:, :, :, :cache.length], want[:, :, :, :cache.length])
            assert bool(torch.isfinite(got).all())


def test_select_then_writes_and_growth_keep_the_rows_apart() -> None:
    cache = _filled(0)
    cache.select(torch.tensor([1, 3]))
    kept = cache.keys[:, :, :, :cache.length].clone()
    cache.write(0, cache.length, torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    cache.length += 1
    cache.ensure(40)
    assert cache.keys.shape == (3, 2, 2, 40, 4)
    assert torch.equal(cache.keys[:, :, :, :7], kept)
    assert bool((cache.keys[0, :, :, 7] == 1).all())
