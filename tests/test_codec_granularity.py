"""The index's granularity (granularity.py): entries of several items, learned from the last aggregate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from host_agent.codec import CodecState, aggregate_local
from host_agent.codec.granularity import choose_group
from host_agent.codec.index import choose_index, encode_index, expand_groups, query_index

N = 320_000


def _rows(workers: int, rows: int, width: int, seed: int) -> list[torch.Tensor]:
    """Embedding-table gradients: each worker's ``rows`` random rows of ``width`` elements, all nonzero."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(workers):
        x = torch.zeros(N // width, width)
        x[torch.randperm(N // width, generator=g)[:rows]] = torch.randn(rows, width, generator=g)
        out.append(x.view(-1))
    return out


def _scattered(workers: int, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(workers):
        x = torch.zeros(N)
        x[torch.randperm(N, generator=g)[:count]] = torch.randn(count, generator=g)
        out.append(x)
    return out


@pytest.mark.parametrize("kind", ["bitmap", "bloom"])
@pytest.mark.parametrize("group", [1, 3, 16])
def test_an_index_of_groups_yields_every_item_of_every_marked_group(kind, group):
    n = 10_007  # the last group is short
    items = torch.randperm(n, generator=torch.Generator().manual_seed(group))[:300].sort().values
    items = torch.cat([items, torch.tensor([n - 1])]).unique()
    spec = choose_index(n, items.numel() * group, 4.0, seed=5, kind=kind, group=group)
    cands = query_index(spec, encode_index(spec, items))
    groups = torch.unique(torch.div(items, group, rounding_mode="floor"))
    expected = expand_groups(groups, group, n)
    assert bool((cands[1:] > cands[:-1]).all()) and int(cands[-1]) < n
    assert torch.isin(expected, cands).all()  # nothing held is lost
    if kind == "bitmap":
        assert torch.equal(cands, expected)  # exact: only the marked groups' items


def test_rows_of_an_embedding_table_make_the_next_round_index_whole_rows():
    xs = _rows(workers=4, rows=200, width=16, seed=1)
    first = aggregate_local(xs, mode="union")
    assert first.state.group == 16, first.stats
    again = _rows(workers=4, rows=200, width=16, seed=2)
    learned = aggregate_local(again, mode="union", state=first.state)
    per_item = aggregate_local(again, mode="union", state=dataclasses.replace(first.state, group=1))
    assert torch.equal(learned.total, per_item.total)  # exact either way (aggregate_local checks the sum)
    assert learned.stats["bytes_per_worker"] < 0.75 * per_item.stats["bytes_per_worker"]
    assert learned.stats["index_words"] * 8 < per_item.stats["index_words"]


def test_scattered_items_keep_one_entry_per_item():
    result = aggregate_local(_scattered(workers=4, count=3000, seed=3), mode="sketch")
    assert result.state.group == 1


def test_a_dense_region_ahead_of_scattered_items_does_not_mislead_the_choice():
    # 70,000 nonzero elements in a row (a dense layer), then 200,000 scattered: counted in windows over
    # the whole bucket, the scattered part decides (a group of 16 would send ~16x its candidates)
    cands = torch.cat([torch.arange(70_000), torch.randperm(10_000_000)[:200_000].sort().values + 70_000])
    cands = cands.unique()
    values = torch.ones((cands.numel(), 1), dtype=torch.int32)
    group, candidates = choose_group(10_070_000, cands, values, 4.0)
    assert group == 1 and candidates == cands.numel()


def test_a_state_saved_before_granularity_loads_with_one_item_per_entry():
    fields = CodecState(3, items=10, exponent=None).as_dict()
    del fields["group"]
    assert CodecState.from_dict(fields).group == 1


@pytest.mark.parametrize("block", [1, 4])
def test_a_union_that_lies_between_the_sampled_windows_is_counted_whole(block):
    # 200,000 candidates (a round of groups, most of them zero) whose few nonzero rows all fall between
    # the 64 windows the choice samples: it must still count them, not divide by an empty sample
    cands = torch.arange(200_000) * 3
    values = torch.zeros((cands.numel(), block), dtype=torch.int32)
    between = torch.tensor([1500, 1501, 1502, 1503, 90_000])  # windows start every ~3,100 candidates
    values[between, -1] = 5
    group, candidates = choose_group(600_000, cands, values, 4.0)
    assert candidates >= between.numel() and 1 <= group <= 64
