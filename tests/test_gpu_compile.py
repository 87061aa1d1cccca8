"""The GPU peel's kernels compile for an H100/H200 (sm_90) on this machine without a GPU, down to a cubin,
with the memory orders its correctness argument needs (gpu/peeling.py's docstring): a device run found
compiler errors the interpreter had accepted, and an order lost in a rewrite would give a peel that is
right in the interpreter (which runs one program at a time) and racy on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("peel_compile.py")


def _ptxas() -> Path | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    ptxas = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return ptxas if ptxas.exists() else None


@pytest.mark.slow
@pytest.mark.skipif(_ptxas() is None, reason="needs Triton with its NVIDIA backend (ptxas)")
def test_the_peel_compiles_for_hopper_with_its_memory_orders() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=SCRIPT.parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == {"count/3", "count/4", "peel/3/1", "peel/3/8", "peel/4/1", "peel/4/8"}
    for case, atoms in found.items():
        if case.startswith("count"):  # the counts need no order: the kernel's end publishes them
            assert set(atoms) == {"atom.global.gpu.relaxed.add.u64"}, (case, atoms)
            continue
        # a removal publishes its acc updates with the state (release); a server reads the state with
        # acquire; a queue slot is written with release and read with acquire; the head moves by CAS
        for atom in ("atom.global.gpu.release.add.u64", "atom.global.gpu.acquire.add.u64",
                     "atom.global.gpu.release.exch.b32", "atom.global.gpu.acquire.add.u32",
                     "atom.global.acq_rel.gpu.cas.b32"):
            assert atoms.get(atom, 0) > 0, (case, atom, atoms)
        assert not any(".relaxed." in atom for atom in atoms), (case, atoms)
