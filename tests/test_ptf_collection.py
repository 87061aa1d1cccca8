"""Plain pytest over ptf_tests/ (or ``pytest -k leaf`` over both folders) skips the PTF files with the
command that runs them, instead of failing each inside ptf's logging (KeyError: 'log_dir')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_plain_pytest_skips_the_ptf_files_with_the_command_that_runs_them() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "ptf_tests/test_two_levels.py", "-q", "-rs", "-p",
         "no:cacheprovider"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 skipped" in done.stdout and "make ptf" in done.stdout, done.stdout
    assert "KeyError" not in done.stdout + done.stderr
