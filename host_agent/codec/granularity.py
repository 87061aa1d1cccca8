"""The index's granularity: how many consecutive items one index entry stands for, learned from the
last aggregate.

Why: the gradient of an embedding table is nonzero in whole rows, so its nonzero items come in runs.
An index whose entries each stand for ``group`` consecutive items costs about ``1/group`` of the bits,
and each marked group brings all its items as candidates (zero where no worker holds one). At the
demo's recommender, rows of 16 and ``group`` 16 cut a union round's bytes by a third.

The choice reads only the last round's decoded union, which every worker holds bit for bit, so every
worker takes the same ``group`` for the next round (it travels in ``CodecState``). Each ``group`` is
priced as the round would cost it, index bytes plus candidates' bytes, with ``index.choose_index``'s
own model; the union's groups are counted in windows spread over it, so the choice costs little however
large the bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import gpu
from .index import choose_index, expected_false_positives, group_entries

GROUPS = (1, 2, 4, 8, 16, 32, 64)
#: Windows of consecutive candidates whose nonzero items the choice counts groups in, spread evenly over
#: the bucket (one region alone, say a dense layer ahead of an embedding table, would mislead it).
_WINDOWS, _WINDOW = 64, 1024


def _nonzero_rows(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1) != 0 if values.shape[1] == 1 else (values != 0).any(dim=1)


def _sample(cands: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The nonzero items of up to _WINDOWS windows of _WINDOW consecutive candidates, in order (so a
    group is counted once, unless it straddles two adjacent windows); all of them where the windows hold
    none (the union lies between them)."""
    k = cands.numel()
    if k > _WINDOWS * _WINDOW:
        starts = torch.tensor(_window_starts(k), device=cands.device)
        at = (starts.unsqueeze(1) + torch.arange(_WINDOW, device=cands.device)).view(-1)
        sample = torch.masked_select(cands.gather(0, at), _nonzero_rows(values.index_select(0, at)))
        if sample.numel():
            return sample
    return cands[_nonzero_rows(values)]


def _window_starts(k: int) -> list[int]:
    """First candidate of each sampled window: window i starts at ``i * (k - _WINDOW) // (_WINDOWS - 1)``,
    in integers, so that every device samples alike (the GPU path's kernel computes the same starts
    itself, so they are never sent to the device)."""
    return [i * (k - _WINDOW) // (_WINDOWS - 1) for i in range(_WINDOWS)]


def _whole(k: int) -> tuple[int, int, int]:
    """(windows, num, den): all of ``k`` candidates, window after window (window i starts at
    ``i * num // den``)."""
    return -(-k // _WINDOW), _WINDOW, 1


def count_windows(k: int) -> tuple[int, int, int, int]:
    """(windows, num, den, window): the windows the GPU path counts among ``k`` candidates, spread as
    :func:`_window_starts` places them, or all of the candidates (the output kernel counts them too:
    ``gpu.fill_output``)."""
    spread = (_WINDOWS, k - _WINDOW, _WINDOWS - 1) if k > _WINDOWS * _WINDOW else _whole(k)
    return (*spread, _WINDOW)


def _counts_triton(cands: torch.Tensor, values: torch.Tensor, counted: torch.Tensor | None
                   ) -> tuple[int, int, Callable[[int], int]]:
    """:func:`_counts` on the GPU path: the figures of :func:`count_windows`' windows, from ``counted``
    (what the output kernel counted) or by one kernel (``gpu.group_counts``), read back once."""
    k = cands.numel()
    if not k:
        return 0, 0, lambda group: 0
    windows = count_windows(k)
    if counted is not None:
        union, size, grouped = gpu.read_counts(counted, windows[0])
    else:
        union, size, grouped = gpu.group_counts(cands, values, *windows)
    if union and not size:  # the union lies between the windows: count all of it
        union, size, grouped = gpu.group_counts(cands, values, *_whole(k), _WINDOW)
    return union, size, grouped.__getitem__


def _counts(cands: torch.Tensor, values: torch.Tensor, counted: torch.Tensor | None
            ) -> tuple[int, int, Callable[[int], int]]:
    """(union, sample size, entries the sample takes in groups of g): what the choice reads."""
    if gpu.on_path():
        return _counts_triton(cands, values, counted)
    counted = values if values.shape[1] == 1 else _nonzero_rows(values)
    union = int(torch.count_nonzero(counted))
    if union == 0:
        return 0, 0, lambda group: 0
    sample = _sample(cands, values)
    return union, sample.numel(), lambda group: group_entries(sample, group).numel()


def choose_group(n_items: int, cands: torch.Tensor, values: torch.Tensor, bytes_per_candidate: float,
                 counted: torch.Tensor | None = None) -> tuple[int, int]:
    """(group, expected candidates) for the next round, from this round's sorted candidates ``cands``
    and their decoded (K, block) ``values`` (a candidate whose sum is zero is not in the union);
    ``counted``: on the GPU path, the figures the output kernel counted for :func:`count_windows`.

    A group that would more than double the candidates never pays (the index is the smaller part of a
    round), so it is not priced. Only the union's size reads every candidate (in one pass, no mask at
    block 1); the groups are counted in the sample.
    """
    union, size, entries = _counts(cands, values, counted)
    if union == 0:
        return 1, 0
    best: tuple[float, int, int] | None = None
    for group in GROUPS:
        if group > n_items:
            break
        grouped = entries(group)
        candidates = min(n_items, math.ceil(grouped * union / size) * group)
        if group > 1 and candidates > 2 * union:
            break
        spec = choose_index(n_items, candidates, bytes_per_candidate, seed=0, group=group)
        sent = candidates + expected_false_positives(spec, candidates)
        cost = 4 * spec.words + sent * bytes_per_candidate
        if best is None or cost < best[0]:
            best = (cost, group, candidates)
    assert best is not None
    return best[1], best[2]
