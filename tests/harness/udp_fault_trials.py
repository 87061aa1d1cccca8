"""Property trials of ``lhc_ina.udp``'s error rule under the socket-fault shim (run by
tests/test_udp_socket_errors.py as ``python -m tests.harness.udp_fault_trials`` with the shim preloaded).

Flushes of several jobs' results on one port, with per-destination errors (EINVAL, EMSGSIZE, ENOBUFS,
ECONNREFUSED, EAGAIN) mixed in at random: every other datagram must reach its job's socket, in order, each
refused one must be counted under its errno, and GSO must stay on (no refusal counted). Both layers run
every example: ``NativeIO`` (udp_batch.c) and ``PythonIO``. Then a fault of the socket's own (EBADF, which
stays) must raise and count every datagram that did not leave. Prints a JSON summary; any failed property
raises (a non-zero exit, the falsifying example in the output).
"""

from __future__ import annotations

import errno
import json
import select
import socket
import struct
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lhc_ina.udp import BatchIO, NativeIO, PythonIO, errno_names, native_udp_available
from tests.harness.socket_faults import fault_address

JOBS = 3
PER_DESTINATION = (errno.EINVAL, errno.EMSGSIZE, errno.ENOBUFS, errno.ECONNREFUSED, errno.EAGAIN)
SIZES = (272, 272, 272, 96)  # mostly one size, so that a job's results form GSO runs

datagram = st.tuples(st.integers(0, JOBS - 1), st.sampled_from((None,) * 3 + PER_DESTINATION),
                     st.sampled_from(SIZES))
flushes = st.lists(st.lists(datagram, min_size=1, max_size=150), min_size=1, max_size=8)


def _destination(host: str, port: int) -> bytes:
    return socket.inet_aton(host) + port.to_bytes(2, "big")


def _drain(sock: socket.socket) -> list[bytes]:
    """What waits in ``sock`` (loopback delivers within the send call, so nothing is still on its way)."""
    out = []
    while select.select([sock], [], [], 0)[0]:
        out.append(sock.recv(2048))
    return out


class Port:
    """One switch-like port (a 127.0.0.1 socket) and the jobs' receivers."""

    def __init__(self) -> None:
        self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.out.bind(("127.0.0.1", 0))
        self.out.setblocking(False)
        self.jobs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(JOBS)]
        for sock in self.jobs:
            sock.bind(("127.0.0.1", 0))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)

    def destination(self, job: int, error: int | None) -> bytes:
        if error is None:
            return _destination("127.0.0.1", self.jobs[job].getsockname()[1])
        return _destination(fault_address(error), self.jobs[job].getsockname()[1])


def check(io: BatchIO, port: Port, plan: list[list[tuple[int, int | None, int]]]) -> None:
    drops_before = Counter(io.drops)
    expected: list[list[bytes]] = [[] for _ in range(JOBS)]
    refused: Counter[int] = Counter()
    for f, flush in enumerate(plan):
        datagrams = [struct.pack("!HH", f, i).ljust(size, b".") for i, (_, _, size) in enumerate(flush)]
        destinations = [port.destination(job, error) for job, error, _ in flush]
        sent, failed = io.send_each(port.out, datagrams, destinations)
        bad = [error for _, error, _ in flush if error is not None]
        assert (sent, failed) == (len(flush) - len(bad), len(bad)), (sent, failed, flush)
        refused.update(bad)
        for i, (job, error, _) in enumerate(flush):
            if error is None:
                expected[job].append(datagrams[i])
    for job, sock in enumerate(port.jobs):
        got = _drain(sock)
        assert got == expected[job], f"job {job}: {len(got)} of {len(expected[job])} datagrams, or disordered"
    assert Counter(io.drops) - drops_before == refused, (io.drops, refused)
    if isinstance(io, NativeIO):
        assert io.gso and io._sender.refusals == 0, "a destination's error counted against GSO"


def fatal_fault(io: BatchIO) -> dict[str, int]:
    """A socket that fails for good (EBADF) in the middle of a flush: OSError(EBADF), and what did not
    leave is counted under it."""
    port = Port()
    destinations = [port.destination(i % JOBS, None) for i in range(40)]
    destinations[25] = _destination(fault_address(errno.EBADF, stays=True), 9)
    try:
        io.send_each(port.out, [b"x" * 272] * 40, destinations)
    except OSError as error:
        assert error.errno == errno.EBADF, error
    else:
        raise AssertionError("a fault of the socket's own did not raise")
    delivered = sum(len(_drain(sock)) for sock in port.jobs)
    assert delivered + io.drops.get(errno.EBADF, 0) == 40, (delivered, io.drops)
    for sock in (port.out, *port.jobs):
        sock.close()
    return {"delivered": delivered, "dropped": io.drops[errno.EBADF]}


def main() -> None:
    layers: list[BatchIO] = [PythonIO()] + ([NativeIO()] if native_udp_available() else [])
    port = Port()
    examples = [0]

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(plan=flushes)
    def trial(plan: list[list[tuple[int, int | None, int]]]) -> None:
        examples[0] += 1
        for io in layers:
            check(io, port, plan)

    trial()
    summary = {"examples": examples[0], "layers": [io.name for io in layers],
               "drops": {io.name: errno_names(io.drops) for io in layers},
               "fatal": {io.name: fatal_fault(type(io)()) for io in layers}}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
