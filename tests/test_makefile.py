"""`make p4` and its parts say what they could not compile, and fail when a compile was asked for and
could not run (a missing compiler used to exit 0)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MISSING = {"P4C": "no-such-p4c", "BF_P4C": "no-such-bf-p4c"}


def make(target: str, **variables: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    args = [f"{name}={value}" for name, value in {**MISSING, "PYTHON": sys.executable, **variables}.items()]
    return subprocess.run(["make", "-s", "-C", str(REPO), target, *args], capture_output=True, text=True,
                          timeout=120)


def test_make_p4_without_any_compiler_names_what_it_skipped_and_fails():
    done = make("p4")
    assert done.returncode != 0
    assert "skipped the v1model program: p4c not found on PATH (no-such-p4c)" in done.stdout
    assert "skipped the TNA program: bf-p4c not found on PATH (no-such-bf-p4c)" in done.stdout
    assert "no P4 compiler found: nothing was compiled" in done.stderr


@pytest.mark.parametrize("target, message", [
    ("p4-v1model", "make p4-v1model: p4c not found on PATH (no-such-p4c)"),
    ("p4-tna", "make p4-tna: bf-p4c not found on PATH (no-such-bf-p4c)"),
    ("p4-p4info", "make p4-v1model: p4c not found on PATH (no-such-p4c)"),
])
def test_asking_for_one_program_without_its_compiler_fails(target, message):
    done = make(target)
    assert done.returncode != 0
    assert message in done.stderr
