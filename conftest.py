"""Skip tests whose marker names something this machine lacks, with a reason that says what; and the
fixtures several test modules share (a module may define its own fixture of the same name)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from lhc_launch.processes import SoftswitchProcess
    from tests.harness.bmv2 import Bmv2Process


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def tofino_compiler() -> str | None:
    """A compiler driver for Tofino: $BF_P4C (as in the Makefile), `bf-p4c` (Intel's SDE), or the `p4c`
    driver installed next to the open-source backend `p4c-barefoot`; None when there is none."""
    for name in (os.environ.get("BF_P4C"), "bf-p4c"):
        found = shutil.which(name) if name else None
        if found:
            return found
    backend = shutil.which("p4c-barefoot")
    if backend and (Path(backend).parent / "p4c").is_file():
        return str(Path(backend).parent / "p4c")
    return None


def _missing(marker: str) -> str | None:
    """Why tests with ``marker`` cannot run here, or None when they can."""
    if marker == "root":
        return None if os.geteuid() == 0 else "needs root (network namespaces, veth, AF_PACKET)"
    if marker == "mininet":
        return None if shutil.which("mn") else "needs Mininet: `make system-deps` installs it"
    if marker == "bmv2":
        return None if shutil.which("simple_switch_grpc") else "needs BMv2 simple_switch_grpc on PATH"
    if marker == "p4c":
        return None if shutil.which("p4c") else "needs the p4c compiler on PATH"
    if marker == "bf_p4c":
        if tofino_compiler():
            return None
        return "needs a Tofino compiler: bf-p4c, $BF_P4C, or p4c-barefoot (with its p4c driver) on PATH"
    if marker == "tshark":
        return None if shutil.which("tshark") else (
            "needs tshark (Wireshark's CLI): `make test` installs the Debian package where it runs as root")
    if marker == "gpu":
        return None if _has_cuda() else "needs a CUDA device"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}
    for item in items:
        for mark in item.iter_markers():
            if mark.name not in reasons:
                reasons[mark.name] = _missing(mark.name)
            if reasons[mark.name]:
                item.add_marker(pytest.mark.skip(reason=reasons[mark.name]))
                break


@pytest.fixture(params=["softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def switch(request) -> Iterator[SoftswitchProcess | Bmv2Process]:
    """A switch process: softswitch, and BMv2 as well where simple_switch_grpc is on PATH (imported here:
    the modules that start processes load only for the tests that use one)."""
    from tests.harness.bmv2 import start_switch

    with start_switch(request.param) as sw:
        yield sw
