"""Plain pytest collects the PTF files here as unittest cases, but they run only under ptf, against a
target on veth pairs, with the configuration ptf's own runner sets (its log directory, the ports, the
test parameters): under pytest each would fail inside ptf's logging. Here they skip, with the command
that runs them; `make test` runs them through that command too (tests/test_ptf.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

RUN_WITH = "make ptf (as root; one file or test: python -m ptf_tests.run --target softswitch TEST)"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=f"a PTF test, run by ptf against a target: {RUN_WITH}")
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(skip)
