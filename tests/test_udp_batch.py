"""lhc_ina/udp_batch.c, the one batched-UDP layer, through ``lhc_ina._udp``: the run planning's properties
(every datagram leaves exactly once per flush, in a message to its own destination, in its order, in runs
within the limits) over random destination sets, forced collisions in the destination table, and more
destinations over time than the table holds; and the socket-error rule of the senders built on it.

The planning is read from the product's own ``Sender``: ``plan`` builds the messages ``send_each`` would
send now, with the sender's table (kept from one flush to the next), limits and GSO state."""

from __future__ import annotations

import errno
import itertools
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lhc_ina import constants as c
from lhc_ina.udp import native_udp_available

pytestmark = pytest.mark.skipif(not native_udp_available(), reason="lhc_ina._udp is not built")


def _destination(address: int, port: int) -> bytes:
    return struct.pack("!IH", address, port)


def _planner(capacity: int, slots: int = 0, segments: int = c.UDP_GSO_SEGMENTS, most: int = c.UDP_GSO_BYTES,
             gso: bool = True):
    """A sender of ``capacity`` datagrams a flush whose runs the tests read through ``plan`` (no socket, so
    GSO stays as ``gso`` says)."""
    from lhc_ina import _udp

    return _udp.Sender(segments, 1, most, gso, capacity=capacity, slots=slots)


def check_flush(plan: list[tuple[int, list[int]]], sizes: list[int], destinations: list[bytes],
                segments: int, most: int) -> None:
    """Every datagram in exactly one message, sent to its own destination, in order per destination, in
    runs of one size within the limits, and no run split without a reason."""
    seen = sorted(i for _, indices in plan for i in indices)
    assert seen == list(range(len(sizes)))
    last: dict[bytes, int] = {}
    for to, indices in plan:
        assert to == indices[0]
        assert {destinations[i] for i in indices} == {destinations[to]}
        assert len(indices) <= segments
        if len(indices) > 1:
            assert len({sizes[i] for i in indices}) == 1 and sizes[indices[0]] > 0
            assert sizes[indices[0]] * len(indices) <= most
        for i in indices:
            assert i > last.get(destinations[i], -1), "a destination's datagrams left out of order"
            last[destinations[i]] = i
    runs: dict[bytes, list[list[int]]] = {}
    for _, indices in plan:
        runs.setdefault(destinations[indices[0]], []).append(indices)
    for chain in runs.values():
        for before, after in itertools.pairwise(chain):
            size = sizes[before[-1]]
            assert (sizes[after[0]] != size or size == 0 or len(before) == segments
                    or size * (len(before) + 1) > most), "a run was split with nothing to split it"


flushes = st.lists(st.lists(st.tuples(st.integers(0, 39), st.sampled_from([272, 272, 272, 100, 0])),
                            min_size=0, max_size=16), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(flushes=flushes, segments=st.sampled_from([1, 2, 3, c.UDP_GSO_SEGMENTS]))
def test_a_tiny_table_forced_into_collisions_and_churn_loses_and_misroutes_nothing(flushes, segments):
    """32 table slots for flushes of up to 16 datagrams to destinations out of 40: most flushes collide,
    and over a run far more destinations pass through the table than it holds."""
    planner = _planner(8 * 2, 32, segments)  # capacity 16, 32 slots: the smallest table it allows
    pool = [_destination(0x7F000001 + (i % 3), 20000 + i) for i in range(40)]
    for flush in flushes:
        destinations = [pool[i] for i, _ in flush]
        sizes = [size for _, size in flush]
        check_flush(planner.plan(sizes, destinations), sizes, destinations, segments, c.UDP_GSO_BYTES)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 65535)), min_size=1, max_size=64,
                unique=True), st.randoms(use_true_random=False))
def test_random_destination_sets_at_the_data_planes_table_size(pairs, random):
    planner = _planner(1024)
    pool = [_destination(a, p) for a, p in pairs]
    for _ in range(5):
        destinations = [random.choice(pool) for _ in range(random.randint(0, 300))]
        sizes = [272] * len(destinations)
        check_flush(planner.plan(sizes, destinations), sizes, destinations, c.UDP_GSO_SEGMENTS,
                    c.UDP_GSO_BYTES)


def _colliding(planner, count: int) -> list[bytes]:
    """``count`` loopback destinations whose probes all start at the same table slot."""
    by_home: dict[int, list[bytes]] = {}
    for port in range(1024, 65536):
        destination = _destination(0x7F000001, port)
        group = by_home.setdefault(planner.home(destination), [])
        group.append(destination)
        if len(group) == count:
            return group
    raise AssertionError("no colliding destinations")


def test_destinations_sharing_a_home_slot_keep_their_own_runs_flush_after_flush():
    """The defect this layer replaced: the table was emptied by probing again from each home slot, so the
    second of two colliding destinations stayed in it, and a later flush appended its copies to a stale
    group (another destination's run) or to none."""
    planner = _planner(1024)
    a, b, other = _colliding(planner, 3)
    orders = [[a, b, a, b], [b, a], [b], [a, b, other, b, a, other], [other, b], [b, a, b]]
    for destinations in orders * 3:
        sizes = [272] * len(destinations)
        check_flush(planner.plan(sizes, destinations), sizes, destinations, c.UDP_GSO_SEGMENTS,
                    c.UDP_GSO_BYTES)


def test_more_distinct_destinations_than_table_slots_over_time_never_hang():
    planner = _planner(16, 32)
    for flush in range(400):  # 6,400 distinct destinations through 32 slots
        destinations = [_destination(0x0A000000 + flush, port) for port in range(1, 17)]
        plan = planner.plan([272] * 16, destinations)
        assert sorted(i for _, indices in plan for i in indices) == list(range(16))


def test_without_gso_one_message_per_datagram_in_queue_order():
    planner = _planner(16, 32, gso=False)
    destinations = [_destination(0x7F000001, 20000 + i % 3) for i in range(10)]
    assert planner.plan([272] * 10, destinations) == [(i, [i]) for i in range(10)]


def test_bad_planner_arguments_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="power of two"):
        _planner(16, 24)
    with pytest.raises(ValueError, match="power of two"):
        _planner(16, 16)
    planner = _planner(4, 8)
    with pytest.raises(ValueError, match="at most 4"):
        planner.plan([1] * 5, [_destination(1, 1)] * 5)
    with pytest.raises(ValueError, match="6"):
        planner.plan([1], [b"short"])


def test_a_closed_socket_raises_ebadf_and_a_refused_datagram_is_only_a_drop():
    from lhc_ina import _udp

    sender = _udp.Sender(c.UDP_GSO_SEGMENTS, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = sock.detach()
    socket.close(fd)
    with pytest.raises(OSError) as raised:
        sender.send_batch(fd, [b"x" * 10] * 5, "127.0.0.1", 9)
    assert raised.value.errno == errno.EBADF
    with pytest.raises(OSError) as raised:
        _udp.recv_batch(fd, bytearray(64), 32, 2)
    assert raised.value.errno == errno.EBADF
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # a datagram too long for IPv4 is refused (EMSGSIZE): lost and counted, nothing raised
        assert sender.send_batch(sock.fileno(), [b"x" * 70000, b"y"], "127.0.0.1", 9) == (1, 1)
    finally:
        sock.close()


def test_a_sender_sends_a_batch_larger_than_its_capacity_in_flushes():
    """A sender of 16 datagrams a flush sends 150 to three sockets in ten flushes through one 32-slot
    table: each socket gets its own datagrams once, in order."""
    from lhc_ina import _udp

    sender = _udp.Sender(c.UDP_GSO_SEGMENTS, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES, capacity=16, slots=32)
    receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for receiver in receivers:
            receiver.bind(("127.0.0.1", 0))
            receiver.settimeout(5.0)
        homes = [socket.inet_aton("127.0.0.1") + r.getsockname()[1].to_bytes(2, "big") for r in receivers]
        to = [(i * i + i // 7) % 3 for i in range(150)]  # uneven: runs of one destination and alternations
        assert all(to.count(k) > 0 for k in range(3))
        datagrams = [struct.pack("!I", i) * 68 for i in range(150)]  # 272 bytes, GSO runs where in a row
        assert sender.send_each(out.fileno(), datagrams, [homes[k] for k in to]) == (150, 0)
        for k, receiver in enumerate(receivers):
            got = [struct.unpack("!I", receiver.recv(512)[:4])[0] for _ in range(to.count(k))]
            assert got == [i for i in range(150) if to[i] == k]
    finally:
        for sock in (*receivers, out):
            sock.close()


def test_a_sender_never_initialized_is_refused_not_run():
    from lhc_ina import _udp

    sender = _udp.Sender.__new__(_udp.Sender)
    with pytest.raises(ValueError, match="never initialized"):
        sender.send_batch(0, [b"x"], "127.0.0.1", 9)
    with pytest.raises(ValueError, match="never initialized"):
        sender.plan([1], [_destination(1, 1)])
    with pytest.raises(ValueError, match="never initialized"):
        sender.home(_destination(1, 1))
