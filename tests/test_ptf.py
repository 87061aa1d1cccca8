"""The PTF suite (ptf_tests/) run by its harness, from pytest: on softswitch always (as root), once per
pipeline, and on BMv2 when simple_switch_grpc is on PATH. The suite's own report is in the output and in
build/ptf/<target>/ (build/ptf/softswitch-<pipeline>/).

The native pipeline (the one softswitch runs where it is built) takes the whole suite; so does the Python
pipeline where it is the only one. Where both are built the Python one, which the differential tests hold
to the native one frame for frame and counter for counter (tests/test_softswitch_native.py), takes the
modules of the round, the two levels and malformed input (:data:`PYTHON_BESIDE_NATIVE`): the whole suite
twice cost make test 40 s more on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from softswitch.native import native_available

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON_BESIDE_NATIVE = ("test_reduction", "test_rounds", "test_two_levels", "test_large_jobs",
                        "test_malformed")


def run_suite(target: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ptf_tests.run", "--target", target, *options],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(660)
@pytest.mark.parametrize("pipeline", [pytest.param("python"), pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline (softswitch/_dataplane.c) is not built"))])
def test_ptf_suite_on_softswitch(pipeline: str) -> None:
    modules = PYTHON_BESIDE_NATIVE if pipeline == "python" and native_available() else ()
    result = run_suite("softswitch", "--pipeline", pipeline, *modules)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-20000:]


@pytest.mark.root
@pytest.mark.bmv2
@pytest.mark.slow
@pytest.mark.timeout(660)
def test_ptf_suite_on_bmv2() -> None:
    result = run_suite("bmv2")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-20000:]
