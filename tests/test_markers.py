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


def test_every_test_has_a_parallel_group_keeping_modules_and_the_host_network_together(
    pytester: pytest.Pytester,
) -> None:
    """``make test`` runs pytest-xdist with ``--dist loadgroup``: a module's tests share one group (its
    module-scoped fixtures are set up once), the tests that use the host's network share another whatever
    their module, and a group a test names itself stands."""
    pytester.makeconftest((REPO_ROOT / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    root: root\n    mininet: mininet\n    slow: slow\n")
    pytester.makepyfile(
        test_alpha=textwrap.dedent(
            """
            import pytest

            def test_plain():
                pass

            @pytest.mark.root
            def test_veths():
                pass

            @pytest.mark.xdist_group("own")
            def test_named():
                pass
            """
        ),
        test_beta=textwrap.dedent(
            """
            import pytest

            pytestmark = pytest.mark.mininet

            def test_emulation():
                pass
            """
        ),
    )
    items, _ = pytester.inline_genitems()
    groups = {item.name: item.get_closest_marker("xdist_group").args[0] for item in items}
    assert groups == {"test_plain": "test_alpha.py", "test_veths": "host-network", "test_named": "own",
                      "test_emulation": "host-network"}


def test_a_parallel_run_keeps_each_group_on_one_worker(pytester: pytest.Pytester) -> None:
    """The groups hold in a real two-worker run, as `make test` runs it. (They silently did not with
    pytest 9.2 and xdist 3.8: every test was scheduled alone, and the host-network tests waited on each
    other's lock across workers.)"""
    pytester.makeconftest((REPO_ROOT / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    root: root\n    mininet: mininet\n    slow: slow\n")
    module = "import pytest\n\n@pytest.mark.parametrize('i', range(8))\ndef test_one(i):\n    pass\n"
    pytester.makepyfile(test_alpha=module, test_beta=module)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    workers: dict[str, set[str]] = {"test_alpha.py": set(), "test_beta.py": set()}
    for line in result.outlines:
        if "PASSED" in line and line.startswith("[gw"):
            worker, test = line.split()[0], line.split()[-1]
            workers[test.split("::")[0]].add(worker)
    assert all(len(found) == 1 for found in workers.values()), workers


@pytest.mark.root
def test_a_host_network_test_holds_the_host_network_lock() -> None:
    """While one host-network test runs, another (on any worker) waits for it: the lock is taken."""
    import fcntl

    from conftest import HOST_NETWORK_LOCK

    with HOST_NETWORK_LOCK.open("a") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
