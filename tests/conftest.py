"""Fixtures several test modules share (a module may define its own fixture of the same name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.processes import Bmv2Process, SoftswitchProcess, start_switch


@pytest.fixture(params=["softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def switch(request) -> Iterator[SoftswitchProcess | Bmv2Process]:
    """Each test runs against softswitch, and against BMv2 where simple_switch_grpc is on PATH."""
    with start_switch(request.param) as sw:
        yield sw
