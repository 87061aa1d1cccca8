"""The compiled kernels' two loop kinds: AVX2 where the CPU has it, scalar elsewhere. Both must give the
torch code's bits; on an AVX2 machine the scalar loops only run under ``LHC_CODEC_SIMD=scalar`` (read
when ``host_agent.codec.cpu`` is imported), hence a child process here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from host_agent.codec import aggregate_local
from host_agent.codec.cpu import KERNELS_VARIABLE, SIMD_VARIABLE, kernel_simd, native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled kernels are not built")

# Peeling (the wave's group hashes), encoding (hashes by chunk, sort by start) and the Bloom query, each
# against its torch reference, on sizes with partial vectors of eight and words of 32 entries.
_SCALAR_AGAINST_TORCH = """
import math, torch
from host_agent.codec.index import choose_index, encode_index, query_bloom_chunks, query_bloom_native
from host_agent.codec.cpu import kernel_simd
from host_agent.codec.peeling import peel_native, peel_parallel
from host_agent.codec.sketch import PEEL_THRESHOLD, cell_ids, encode_sketch_native, encode_sketch_torch
from host_agent.codec.sketch_spec import SketchSpec

assert kernel_simd() == "scalar", kernel_simd()
g = torch.Generator().manual_seed(11)
for k, block, load in ((70_003, 1, 0.8), (70_003, 2, 1.3), (3_001, 3, 0.8)):
    items = torch.randperm(1 << 22, generator=g)[:k].sort().values
    values = torch.randint(-(2**31), 2**31, (k, block), generator=g, dtype=torch.int64).to(torch.int32)
    spec = SketchSpec(math.ceil(PEEL_THRESHOLD * k / load), block, seed=k + block)
    words = encode_sketch_torch(spec, items, values)
    for threads in (1, 2):
        assert torch.equal(encode_sketch_native(spec, items, values, threads=threads), words)
        native = peel_native(spec, items, words.view(spec.cells, block), threads=threads)
        parallel = peel_parallel(cell_ids(spec, items), words.view(spec.cells, block))
        assert torch.equal(native.peeled, parallel.peeled) and torch.equal(native.values, parallel.values)
for n_items, held in ((100_003, 900), (70_001, 30)):
    items = torch.randperm(n_items, generator=g)[:held].sort().values
    spec = choose_index(n_items, held, 4.0, seed=held, kind="bloom")
    words = encode_index(spec, items)
    for threads in (1, 2):
        assert torch.equal(query_bloom_native(spec, words, threads=threads), query_bloom_chunks(spec, words))
print("scalar loops agree")
"""


def _child(code: str, simd: str, kernels: str = "native") -> subprocess.CompletedProcess:
    env = {**os.environ, SIMD_VARIABLE: simd, KERNELS_VARIABLE: kernels}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def test_the_scalar_loops_give_the_torch_bits():
    done = _child(_SCALAR_AGAINST_TORCH, "scalar")
    assert done.returncode == 0 and "scalar loops agree" in done.stdout, done.stderr


def test_which_loops_run_is_said_and_a_bad_choice_is_refused():
    assert kernel_simd() in ("avx2", "scalar")
    done = _child("from host_agent.codec.cpu import kernel_simd; print(kernel_simd())", "auto")
    assert done.stdout.strip() == kernel_simd()
    done = _child("import host_agent.codec.cpu", "sse9")
    assert done.returncode != 0 and "LHC_CODEC_SIMD must be 'auto' or 'scalar'" in done.stderr


_KERNELS_OF_A_CALL = """
import torch
from host_agent.codec import aggregate_local
x = torch.zeros(5000)
x[::50] = 1.0
print(aggregate_local([x, x], mode="sketch").stats["kernels"])
"""


@pytest.mark.parametrize(("simd", "kernels", "says"), [
    ("scalar", "native", "native/scalar"),
    ("auto", "torch", "torch"),  # what an install without a compiler runs
])
def test_every_call_says_what_ran_its_codec(simd, kernels, says):
    x = torch.zeros(5000)
    x[::50] = 1.0
    assert aggregate_local([x, x], mode="sketch").stats["kernels"] == f"native/{kernel_simd()}"
    done = _child(_KERNELS_OF_A_CALL, simd, kernels)
    assert done.stdout.strip() == says, done.stderr
