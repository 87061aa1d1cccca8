"""`lhc-bench codec --peel-trials N`: how often peeling fails at a case's size, the hypergraph alone
deciding (candidates are random subsets, values do not matter)."""

from __future__ import annotations

import sys

import torch


def _random_subset(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """A uniformly random sorted k-subset of range(n), in O(k log k) rather than randperm's O(n)."""
    if k > n:
        raise ValueError(f"cannot draw {k} distinct items of {n}")
    drawn = torch.empty(0, dtype=torch.int64)
    while drawn.numel() < k:
        more = torch.randint(n, (k + k // 8 + 64,), generator=gen)
        drawn = torch.unique(torch.cat([drawn, more]))
    return drawn[torch.randperm(drawn.numel(), generator=gen)[:k]].sort().values


def peel_trials(n_items: int, union: int, margin: float, trials: int, seed: int, device: str) -> dict:
    """Peeling failures over ``trials`` random candidate sets of ``union`` items, sketch sized as the
    codec sizes it from an expectation of ``union`` (the hypergraph alone decides; values do not)."""
    from tqdm import tqdm

    from host_agent.codec.peeling import peel
    from host_agent.codec.sketch import sketch_cells
    from host_agent.codec.sketch_spec import SketchSpec
    from lhc_ina.constants import LANES

    cells = sketch_cells(union, margin, 1, LANES)
    gen = torch.Generator().manual_seed(seed)
    failures, residues = 0, []
    for trial in tqdm(range(trials), desc="peel trials", file=sys.stderr, disable=trials < 10):
        cands = _random_subset(n_items, union, gen).to(device)
        spec = SketchSpec(cells, 1, seed * 1_000_003 + trial)
        left = peel(spec, cands, torch.zeros((cells, 1), dtype=torch.int32, device=device)).residue
        failures += bool(left.numel())
        residues.append(left.numel())
    return {
        "peel_trials": trials,
        "margin": margin,
        "cells_per_candidate": cells / union,
        "failures": failures,
        "failure_rate": failures / trials,
        "max_residue": max(residues) if residues else 0,
    }
