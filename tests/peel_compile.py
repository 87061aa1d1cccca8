"""Compile the GPU peel's kernels for an H100/H200 (sm_90) on a machine without a GPU, through Triton's
ahead-of-time path down to a cubin (run as a script by tests/test_codec_gpu.py, without
``TRITON_INTERPRET``: under the interpreter a kernel is not a compilable function). Prints one JSON line:
per kernel and case, the PTX atomics by their memory-order qualifier.

    python tests/peel_compile.py
"""

from __future__ import annotations

import collections
import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from host_agent.codec.gpu import peeling

HOPPER = GPUTarget("cuda", 90, 32)
_SEEDS = dict.fromkeys(("start_seed", "s0", "s1", "s2", "s3", "starts", "seg"), "i32")
COUNT = {"cands": "*i64", "cells": "*i32", "acc": "*i32", "state": "*i64", "k": "i32", "m": "i32",
         "block": "i32", **_SEEDS, "ARITY": "constexpr", "TILE": "constexpr"}
PEEL = {"cands": "*i64", "acc": "*i32", "state": "*i64", "queue": "*i32", "claimed": "*i32", "values": "*i32",
        "peeled": "*u8", "ctl": "*i32", "m": "i32", "block": "i32", **_SEEDS, "ARITY": "constexpr",
        "PROGRAMS": "constexpr", "TILE": "constexpr", "LANES": "constexpr"}


def atomics(kernel, signature: dict[str, str], constants: dict[str, int]) -> dict[str, int]:
    """Compile ``kernel`` for sm_90 (to a cubin) and count its PTX atomics by opcode."""
    where = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=where), target=HOPPER,
                              options={"num_warps": 8})
    assert compiled.asm["cubin"], "no cubin"
    lines = (line.strip().lstrip("@%p0123456789 ") for line in compiled.asm["ptx"].splitlines())
    return dict(collections.Counter(line.split()[0] for line in lines if line.startswith("atom.")))


def main() -> None:
    found = {}
    for arity in (3, 4):
        found[f"count/{arity}"] = atomics(peeling._count, COUNT, {"ARITY": arity, "TILE": 1024})
        for lanes, tile in ((1, 512), (8, 64)):
            found[f"peel/{arity}/{lanes}"] = atomics(peeling._peel, PEEL, {"ARITY": arity, "PROGRAMS": 132,
                                                                           "TILE": tile, "LANES": lanes})
    print(json.dumps(found))


if __name__ == "__main__":
    main()
