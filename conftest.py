"""Skip tests whose marker names something this machine lacks, with a reason that says what; group the
tests for a parallel run (``make test``: pytest-xdist, ``--dist loadgroup``); and the fixtures several
test modules share (a module may define its own fixture of the same name)."""

from __future__ import annotations

import fcntl
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


#: Markers of tests that use the machine's own network (veth pairs, Mininet, AF_PACKET, processes found
#: by name): they share one xdist group, so that they run one at a time in a parallel run.
HOST_NETWORK = ("root", "mininet")
HOST_NETWORK_GROUP = "host-network"


def xdist_group(markers: set[str], module: str) -> str:
    """The xdist group of a test with ``markers`` in ``module`` that names none itself: the host network's
    one group, else its module's (a module's tests and its module-scoped fixtures stay on one worker; a
    module spreads over workers only where it names groups of its own)."""
    return HOST_NETWORK_GROUP if markers & set(HOST_NETWORK) else module


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}
    for item in items:
        for mark in item.iter_markers():
            if mark.name not in reasons:
                reasons[mark.name] = _missing(mark.name)
            if reasons[mark.name]:
                item.add_marker(pytest.mark.skip(reason=reasons[mark.name]))
                break
        if item.get_closest_marker("xdist_group") is None:
            markers = {mark.name for mark in item.iter_markers()}
            item.add_marker(pytest.mark.xdist_group(xdist_group(markers, item.path.name)))
    # The groups with the most `slow` tests first (a stable sort: a group's tests keep their order), so
    # that a parallel run (`--no-loadscope-reorder`) starts the longest groups and ends on short ones.
    slow: dict[str, int] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group").args[0]
        slow[group] = slow.get(group, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.get_closest_marker("xdist_group").args[0]])


#: The host network's lock: held by each of its tests, so they run one at a time even where the scheduler
#: spreads their group over workers. It did with pytest 9.2 (pytest-dev/pytest-xdist#1386, hence the pin
#: below 9.2): two Mininet runs at once, both binding the controller's address 10.0.0.254:9560 and each
#: finding the other's interfaces. What it guards is the machine's (addresses, interface names, the
#: leftovers check over every process), so the lock is the machine's too: two checkouts' runs share it.
#: Taken per test, after any module-scoped fixture (no host-network module has one); a wait counts
#: against the test's timeout, so it fails rather than hangs.
HOST_NETWORK_LOCK = (Path("/run/lock") if Path("/run/lock").is_dir() else Path(__file__).resolve().parent
                     / "build") / "lhc-ina-host-network.lock"


@pytest.fixture(autouse=True)
def _one_host_network_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if not any(request.node.get_closest_marker(name) for name in HOST_NETWORK):
        yield
        return
    HOST_NETWORK_LOCK.parent.mkdir(exist_ok=True)
    with HOST_NETWORK_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(params=["softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def switch(request) -> Iterator[SoftswitchProcess | Bmv2Process]:
    """A switch process: softswitch, and BMv2 as well where simple_switch_grpc is on PATH (imported here:
    the modules that start processes load only for the tests that use one)."""
    from tests.harness.bmv2 import start_switch

    with start_switch(request.param) as sw:
        yield sw
