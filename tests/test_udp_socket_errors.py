"""The one socket-error rule of every sender (lhc_ina/udp_batch.c's udp_error_is_fatal and its twin,
lhc_ina/udp.py's is_fatal): only the socket's own faults (constants.UDP_FATAL_ERRORS) end a flush and
raise; an error about one destination (EINVAL for an address a loopback-bound socket may not send to, a
full buffer, an unreachable port) costs that datagram alone, counted under its errno, and never counts
against GSO. Issue 39: one tenant's unroutable replica cost another tenant's results."""

from __future__ import annotations

import errno
import re
import socket
import struct
from pathlib import Path

import pytest

from lhc_ina import constants as c
from lhc_ina.udp import FATAL_ERRNOS, NativeIO, PythonIO, native_udp_available
from tests.harness.socket_faults import build_shim, run_with_faults

LAYERS = [pytest.param(PythonIO, id="python"),
          pytest.param(NativeIO, id="native", marks=pytest.mark.skipif(not native_udp_available(),
                                                                        reason="lhc_ina._udp is not built"))]
#: Destinations a socket bound to 127.0.0.1 may not send to: the kernel answers EINVAL for each.
UNROUTABLE = [("10.9.9.9", c.UDP_PORT_BASE), ("240.0.0.1", c.UDP_PORT_BASE), ("127.0.0.1", 0)]


def test_the_fatal_errnos_are_one_list_in_c_and_python():
    """udp_batch.h's UDP_FATAL_ERRORS names what constants.UDP_FATAL_ERRORS names, and the built C rule
    (lhc_ina._udp.FATAL_ERRORS) and the Python one hold the same errnos."""
    header = (Path(__file__).resolve().parents[1] / "lhc_ina" / "udp_batch.h").read_text()
    listed = re.search(r"#define UDP_FATAL_ERRORS\(X\)(.*)", header).group(1)
    assert tuple(re.findall(r"X\((\w+)\)", listed)) == c.UDP_FATAL_ERRORS
    assert {getattr(errno, name) for name in c.UDP_FATAL_ERRORS} == FATAL_ERRNOS
    assert errno.EINVAL not in FATAL_ERRNOS and errno.ENXIO not in FATAL_ERRNOS
    if native_udp_available():
        from lhc_ina import _udp

        assert set(_udp.FATAL_ERRORS) == FATAL_ERRNOS


@pytest.mark.parametrize("layer", LAYERS)
def test_an_unroutable_replica_costs_its_datagrams_alone_and_gso_stays_on(layer):
    """Two jobs' results share a loopback-bound port; job A's also go to three destinations the kernel
    refuses with EINVAL, in runs of equal size. Every flush delivers all of B's and A's good results in
    order; A's refused ones are counted as EINVAL; GSO stays on after more flushes than UDP_GSO_REFUSALS."""
    io = layer()
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.bind(("127.0.0.1", 0))
    out.setblocking(False)
    receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for receiver in receivers:
            receiver.bind(("127.0.0.1", 0))
            receiver.settimeout(3)
        good = [socket.inet_aton("127.0.0.1") + r.getsockname()[1].to_bytes(2, "big") for r in receivers]
        bad = [socket.inet_aton(host) + port.to_bytes(2, "big") for host, port in UNROUTABLE]
        flushes = 3 * c.UDP_GSO_REFUSALS
        for f in range(flushes):
            datagrams = [struct.pack("!HH", f, i).ljust(272, b".") for i in range(40)]
            destinations = [bad[i % 3] if i % 4 == 1 else good[i % 2] for i in range(40)]
            assert io.send_each(out, datagrams, destinations) == (30, 10)
            for k, receiver in enumerate(receivers):
                expected = [d for d, to in zip(datagrams, destinations, strict=True) if to == good[k]]
                assert [receiver.recv(512) for _ in expected] == expected
        assert io.drops == {errno.EINVAL: 10 * flushes}
        if isinstance(io, NativeIO):
            assert io.gso and io._sender.refusals == 0
    finally:
        for sock in (out, *receivers):
            sock.close()


def test_per_destination_errors_mixed_into_flushes_lose_only_their_datagrams(tmp_path):
    """The property trials of tests/harness/udp_fault_trials.py (hypothesis) under the socket-fault shim:
    EINVAL, EMSGSIZE, ENOBUFS, ECONNREFUSED and EAGAIN at random among three jobs' results, on both
    layers: every other datagram delivered in order, each refused one counted under its errno, GSO on;
    and EBADF (the socket's own) raises with every datagram that did not leave counted."""
    summary = run_with_faults(build_shim(tmp_path), "tests.harness.udp_fault_trials")
    assert summary["examples"] == 40
    names = {errno.errorcode[e] for e in (errno.EINVAL, errno.EMSGSIZE, errno.ENOBUFS, errno.ECONNREFUSED,
                                          errno.EAGAIN)}
    for layer in summary["layers"]:
        assert set(summary["drops"][layer]) == names  # every kind was drawn, and only those were counted
        fatal = summary["fatal"][layer]
        assert fatal["dropped"] >= 1 and fatal["delivered"] + fatal["dropped"] == 40
    if native_udp_available():
        assert summary["drops"]["native"] == summary["drops"]["python"]
