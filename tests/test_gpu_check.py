"""`make gpu-check` on a machine without a GPU: it runs, records the environment, says why it skipped each
device step, and writes its summary; the targets it checks on a GPU are read correctly; and the tests it
would run on one are collected."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import DEVICE_TESTS, STEPS, _case_line, _targets

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA device, make gpu-check is the device run")
def test_make_gpu_check_on_a_cpu_skips_the_device_steps_and_says_why(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    out = tmp_path / "out"
    variables = [f"OUT={out}", f"GPU_PYTHON={sys.executable}", f"WHEELS={tmp_path / 'no-wheels'}",
                 f"GPU_CHECK_ARGS=--site {tmp_path / 'site'}"]
    done = subprocess.run(["make", "-s", "-C", str(REPO), "gpu-check", *variables], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    status = {step["step"]: step for step in summary["steps"]}
    assert list(status) == list(STEPS) and summary["passed"]
    assert status["environment"]["status"] == "passed"
    assert json.loads((out / "environment.json").read_text())["cuda"] is False
    assert status["wheels"]["status"] == "skipped" and "no wheels" in status["wheels"]["detail"]
    assert status["build"]["status"] == "passed"
    for step in ("bench", "tests", "kernels"):
        assert status[step]["status"] == "skipped" and "no CUDA device" in status[step]["detail"], step
    assert (out / "summary.txt").read_text().startswith("gpu-check: PASSED")


def row(mode: str, layout: str, encode: float, decode: float, launches: int, exact: bool = True) -> dict:
    return {"mode": mode, "density": 0.01, "layout": layout, "encode_memcpy": encode, "decode_memcpy": decode,
            "gpu_launches": {"encode": 11, "decode": launches}, "exact": exact}


def test_the_targets_are_read_from_the_default_cases_sketch_row() -> None:
    met = _targets([row("sketch", "plain", 3.0, 12.0, 13), row("sketch", "fused", 9.0, 80.0, 13),
                    row("union", "plain", 2.0, 1.5, 10)])
    assert all(verdict.startswith("met") for verdict in met.values()), met
    missed = _targets([row("sketch", "plain", 6.0, 21.0, 65, exact=False)])
    assert all(verdict.startswith("missed") for verdict in missed.values()), missed
    assert _targets([row("union", "plain", 1.0, 1.0, 1)]) == {
        "default case": "missing: no sketch row at 1% with the plain layout"}


def test_each_case_prints_its_stages_against_the_memcpy() -> None:
    case = dict(row("sketch", "plain", 4.0, 15.0, 11), memcpy_s=60e-6,
                stage_s={"index": 120e-6, "peel": 300e-6, "output": 30e-6, "granularity": 90e-6})
    case["gpu_launches"].update(encode_waits=0, decode_waits=3)
    line = _case_line(case)
    assert "decode stages: index 2.00, peel 5.00, output 0.50, granularity 1.50" in line, line
    assert "encode 4.00 / decode 15.00 memcpy (60 us" in line and "host waits 0/3" in line, line


def test_the_device_tests_it_runs_are_collected() -> None:
    """The tests step's selection (the gpu-marked tests of these files) and the kernels step's file exist
    and are collected, here with the device tests skipped."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", *DEVICE_TESTS]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    names = " ".join(collected)
    expected = ["test_cuda_gives_the_cpu_result_bit_for_bit", "test_fsdp_trains_through_lhc_on_cuda",
                "test_cuda_buckets_through_softswitch_give_the_cpu_run", "test_the_hook_runs_with_nccl",
                "test_reduce_scatter_on_cuda_decodes_only_the_shard",
                "test_the_lhc_backend_on_nccl_with_cuda_tensors"]
    if importlib.util.find_spec("triton") is not None:  # tests/test_codec_gpu.py skips whole without it
        expected.append("test_a_gpu_session_sends_through_pinned_buffers_and_keeps_its_bucket")
    for test in expected:
        assert test in names, test
