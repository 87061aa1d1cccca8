"""Tests whose marker names something this machine lacks are skipped, with a reason that says what."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
REPO_ROOT = Path(__file__).resolve().parent.parent


def test_missing_tools_and_privileges_give_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    import conftest

    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("BF_P4C", raising=False)
    assert "p4c" in conftest._missing("p4c")
    assert "bf-p4c" in conftest._missing("bf_p4c")
    assert "simple_switch_grpc" in conftest._missing("bmv2")
    assert "make system-deps" in conftest._missing("mininet")
    assert "tshark" in conftest._missing("tshark")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in conftest._missing("root")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert conftest._missing("root") is None
    assert conftest._missing("slow") is None  # a plain label: never skipped


def test_marked_tests_are_skipped_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest((REPO_ROOT / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    p4c: needs p4c\n    slow: slow\n")
    pytester.makepyfile(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.p4c
            def test_needs_compiler():
                raise AssertionError("must not run without p4c")

            @pytest.mark.slow
            def test_slow_runs():
                pass
            """
        )
    )
    monkeypatch.setenv("PATH", "")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs the p4c compiler on PATH*"])
