"""The codec alone, in one process: aggregate sparse gradients of several workers and check the sums.

Each worker holds a sparse gradient (independent supports, like embedding or top-k gradients). The
codec runs the full multi-worker protocol in process (the switch's ADD/OR done in memory) in every
mode, and the demo prints what each mode put on the wire per worker against the dense baseline, and
whether the decoded aggregate equals the sum bit for bit: of the integers, or of the floats quantized
at the scale the workers agreed (``scale_exponent`` s: q = round(x * 2^s)).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from host_agent.codec import aggregate_local
from host_agent.codec.quantize import dequantize, quantize


def sparse_gradients(
    workers: int, length: int, density: float, *, floats: bool, seed: int
) -> list[torch.Tensor]:
    """One sparse tensor per worker: ``density * length`` random positions hold random values."""
    generator = torch.Generator().manual_seed(seed)
    nonzeros = max(1, int(density * length))
    out = []
    for _ in range(workers):
        positions = torch.randperm(length, generator=generator)[:nonzeros]
        if floats:
            values = torch.randn(nonzeros, generator=generator) * 1e-3
            tensor = torch.zeros(length, dtype=torch.float32)
        else:
            values = torch.randint(-(2**20), 2**20, (nonzeros,), generator=generator, dtype=torch.int32)
            tensor = torch.zeros(length, dtype=torch.int32)
        tensor[positions] = values
        out.append(tensor)
    return out


def expected_total(inputs: list[torch.Tensor], scale: int | None) -> torch.Tensor:
    """What lossless means: the sum of the workers' integers, or of their floats quantized at ``scale``."""
    if not inputs[0].is_floating_point():
        return torch.stack(inputs).sum(dim=0, dtype=torch.int64).to(torch.int32)
    summed = sum(quantize(x, scale).to(torch.int64) for x in inputs)
    return dequantize(summed.to(torch.int32), scale, inputs[0].dtype)


def run_case(inputs: list[torch.Tensor], mode: str, block: int) -> dict:
    start = time.perf_counter()
    result = aggregate_local(inputs, mode=mode, block=block)
    elapsed = time.perf_counter() - start
    stats = result.stats
    float_sum = torch.stack(inputs).double().sum(dim=0)
    return {
        "mode": mode,
        "block": block,
        "dtype": str(inputs[0].dtype).removeprefix("torch."),
        "exact": torch.equal(result.total, expected_total(inputs, stats["scale"])),
        "max_abs_error_vs_float_sum": (result.total.double() - float_sum).abs().max().item(),
        "scale_exponent": stats["scale"],
        "bytes_per_worker": stats["bytes_per_worker"],
        "vs_dense": round(stats["bytes_per_worker"] / (inputs[0].numel() * 4), 4),
        "rounds": stats["rounds"],
        "candidates": stats["candidates"],
        "residue": stats["residue"],
        "seconds": round(elapsed, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--length", type=int, default=1 << 20)
    parser.add_argument("--density", type=float, default=0.01, help="fraction of nonzeros per worker")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    print(
        f"{args.workers} workers, {args.length} elements each, {args.density:.1%} nonzero per worker",
        file=sys.stderr,
    )
    ok = True
    for floats in (False, True):
        inputs = sparse_gradients(args.workers, args.length, args.density, floats=floats, seed=args.seed)
        for mode in ("dense", "sketch", "union"):
            row = run_case(inputs, mode, block=1)
            ok &= row["exact"]
            print(json.dumps(row))
    print("all aggregates exact" if ok else "MISMATCH: an aggregate differs from the sum", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
