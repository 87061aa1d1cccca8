"""The P4Runtime client: canonical value encodings, entity builders by P4Info name, error decoding, and the
connection logic (arbitration, write errors, reads) against an in-process fake P4Runtime server."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from lhc_ina.p4info import P4InfoError, P4InfoIndex
from lhc_ina.p4rt import (
    EntityBuilder,
    P4RuntimeClient,
    P4RuntimeError,
    P4RuntimeValueError,
    decode_table_entry,
    decode_value,
    encode_value,
    multicast_group_entry,
    to_entity,
)

ROUTES = "LhcIngress.ipv4_routes"
L2 = "LhcIngress.l2_forward"


@pytest.fixture(scope="module")
def lhc() -> EntityBuilder:
    return EntityBuilder(P4InfoIndex.from_file())


# --- values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "width", "expected"),
    [
        (0, 8, b"\x00"),
        (0, 48, b"\x00"),
        (1, 9, b"\x01"),
        (255, 9, b"\xff"),
        (256, 9, b"\x01\x00"),
        (0x4C40, 16, b"\x4c\x40"),
        ("10.0.0.1", 32, b"\x0a\x00\x00\x01"),
        ("0.0.1.2", 32, b"\x01\x02"),
        ("02:00:00:00:00:0a", 48, b"\x02\x00\x00\x00\x00\x0a"),
        ("00:00:00:00:01:ff", 48, b"\x01\xff"),
        (b"\x00\x00\x07", 16, b"\x07"),
        (2**32 - 1, 32, b"\xff\xff\xff\xff"),
    ],
)
def test_values_encode_to_the_shortest_big_endian_string(value: object, width: int, expected: bytes) -> None:
    assert encode_value(value, width) == expected
    assert decode_value(expected) == decode_value(b"\x00\x00" + expected)


@pytest.mark.parametrize(
    ("value", "width", "message"),
    [
        (512, 9, "does not fit in 9 bits"),
        (2**32, 32, "does not fit in 32 bits"),
        (-1, 8, "negative"),
        (True, 8, "bool"),
        ("10.0.0", 32, "neither an IPv4 address nor a MAC"),
        ("02:00:00:00:00:01", 32, "does not fit in 32 bits"),
        (1.5, 8, "cannot encode"),
    ],
)
def test_values_that_do_not_fit_are_refused(value: object, width: int, message: str) -> None:
    with pytest.raises(P4RuntimeValueError, match=message):
        encode_value(value, width)


# --- entities on the lhc P4Info ---------------------------------------------------------------------
def test_job_entry_encodes_every_param_by_name(lhc: EntityBuilder) -> None:
    params = {"job_index": 3, "slot_base": 0, "slot_count": 16, "fan_in": 8, "mcast_grp": 7, "epoch": 0x1234}
    entry = lhc.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 42}, "LhcIngress.set_job", params)
    info = lhc.p4info
    assert entry.table_id == info.table("LhcIngress.jobs").id
    assert [(m.field_id, m.exact.value) for m in entry.match] == [(1, b"\x2a")]
    assert entry.action.action.action_id == info.action("LhcIngress.set_job").id
    values = [p.value for p in entry.action.action.params]
    assert values == [b"\x03", b"\x00", b"\x10", b"\x08", b"\x07", b"\x12\x34"]
    decoded = decode_table_entry(info, entry)
    assert decoded.table == "LhcIngress.jobs"
    assert decoded.match == {"hdr.lhc.job_id": 42}
    assert decoded.action == "LhcIngress.set_job"
    assert decoded.params == params


def test_worker_entry_takes_an_ipv4_string(lhc: EntityBuilder) -> None:
    entry = lhc.table_entry(
        "LhcIngress.workers",
        {"hdr.lhc.job_id": 1, "hdr.lhc.worker_id": 0, "hdr.ipv4.src_addr": "10.0.0.1",
         "hdr.udp.src_port": 40000, "standard_metadata.ingress_port": 3},
        "LhcIngress.admit_worker",
        {"worker_bit": 1 << 31},
    )
    values = [m.exact.value for m in entry.match]
    assert values == [b"\x01", b"\x00", b"\x0a\x00\x00\x01", b"\x9c\x40", b"\x03"]
    assert entry.action.action.params[0].value == b"\x80\x00\x00\x00"


@pytest.mark.parametrize("spec", ["10.1.0.0/16", ("10.1.0.0", 16), (0x0A010000, 16)])
def test_lpm_match_forms(lhc: EntityBuilder, spec: object) -> None:
    entry = lhc.table_entry(
        "LhcIngress.ipv4_routes",
        {"hdr.ipv4.dst_addr": spec},
        "LhcIngress.route",
        {"port": 2, "src_mac": "02:00:00:00:00:fe", "dst_mac": "02:00:00:00:02:01"},
    )
    (field_match,) = entry.match
    assert (field_match.lpm.value, field_match.lpm.prefix_len) == (b"\x0a\x01\x00\x00", 16)


def test_lpm_prefix_zero_is_left_out_and_host_bits_are_refused(lhc: EntityBuilder) -> None:
    route = {"port": 1, "src_mac": 1, "dst_mac": 2}
    assert not lhc.table_entry(
        "LhcIngress.ipv4_routes", {"hdr.ipv4.dst_addr": "0.0.0.0/0"}, "LhcIngress.route", route
    ).match
    with pytest.raises(P4RuntimeValueError, match="beyond the /16 prefix"):
        lhc.table_entry(ROUTES, {"hdr.ipv4.dst_addr": "10.1.2.0/16"}, "LhcIngress.route", route)
    with pytest.raises(P4RuntimeValueError, match=r"outside 0\.\.32"):
        lhc.table_entry(ROUTES, {"hdr.ipv4.dst_addr": ("10.0.0.0", 33)}, "LhcIngress.route", route)


def test_param_width_is_checked_by_name(lhc: EntityBuilder) -> None:
    with pytest.raises(P4RuntimeValueError, match=r"LhcIngress.set_port\(port\).*9 bits"):
        lhc.table_entry(L2, {"hdr.ethernet.dst_addr": 1}, "LhcIngress.set_port", {"port": 512})


def test_match_width_is_checked(lhc: EntityBuilder) -> None:
    with pytest.raises(P4RuntimeValueError, match=r"hdr.lhc.worker_id.*8 bits"):
        lhc.table_entry(
            "LhcIngress.workers",
            {"hdr.lhc.job_id": 1, "hdr.lhc.worker_id": 256, "hdr.ipv4.src_addr": 1},
            "LhcIngress.admit_worker",
            {"worker_bit": 1},
        )


@pytest.mark.parametrize(
    ("table", "match", "action", "params", "error", "message"),
    [
        ("LhcIngress.nope", {}, None, None, P4InfoError, "no table named 'LhcIngress.nope'"),
        ("LhcIngress.jobs", {"hdr.lhc.jobid": 1}, None, None, P4InfoError, "no match field 'hdr.lhc.jobid'"),
        ("LhcIngress.jobs", {}, None, None, P4RuntimeValueError, "field 'hdr.lhc.job_id' is required"),
        ("LhcIngress.jobs", {"hdr.lhc.job_id": 1}, "LhcIngress.nope", {}, P4InfoError, "no action named"),
        (
            "LhcIngress.jobs",
            {"hdr.lhc.job_id": 1},
            "LhcIngress.set_port",
            {"port": 1},
            P4InfoError,
            "not an action of table LhcIngress.jobs",
        ),
        (
            L2,
            {"hdr.ethernet.dst_addr": 1},
            "LhcIngress.set_port",
            {"prot": 1},
            P4InfoError,
            "has no parameter 'prot'",
        ),
        (
            L2,
            {"hdr.ethernet.dst_addr": 1},
            "LhcIngress.set_port",
            {},
            P4RuntimeValueError,
            "missing parameter",
        ),
        (
            L2,
            {"hdr.ethernet.dst_addr": 1},
            None,
            {"port": 1},
            P4RuntimeValueError,
            "params given without an action",
        ),
    ],
)
def test_unknown_names_give_clear_errors(
    lhc: EntityBuilder,
    table: str,
    match: dict,
    action: str | None,
    params: dict | None,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        lhc.table_entry(table, match, action, params)


def test_match_only_entry_for_deletes(lhc: EntityBuilder) -> None:
    entry = lhc.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 5})
    assert not entry.HasField("action")
    assert to_entity(entry).WhichOneof("entity") == "table_entry"


def test_default_action_entry(lhc: EntityBuilder) -> None:
    entry = lhc.default_action("LhcIngress.l2_forward", "LhcIngress.drop")
    assert entry.is_default_action and not entry.match
    assert decode_table_entry(lhc.p4info, entry).action == "LhcIngress.drop"


def test_counter_entry_index_is_range_checked(lhc: EntityBuilder) -> None:
    size = lhc.p4info.counter("LhcIngress.lhc_stats").size
    assert lhc.counter_entry("LhcIngress.lhc_stats", size - 1).index.index == size - 1
    assert not lhc.counter_entry("LhcIngress.lhc_stats").HasField("index")
    with pytest.raises(P4RuntimeValueError, match=f"has {size} cells"):
        lhc.counter_entry("LhcIngress.lhc_stats", size)
    with pytest.raises(P4InfoError, match="no counter named"):
        lhc.counter_entry("LhcIngress.stats")


def test_multicast_group_replicas() -> None:
    entry = multicast_group_entry(7, [(1, 0), (2, 1), (1, 2)])
    group = entry.multicast_group_entry
    assert group.multicast_group_id == 7
    assert [(r.egress_port, r.instance) for r in group.replicas] == [(1, 0), (2, 1), (1, 2)]
    assert to_entity(group).packet_replication_engine_entry == entry
    with pytest.raises(P4RuntimeValueError, match="multicast group id 0"):
        multicast_group_entry(0, [])


# --- ternary, range and optional on a synthetic P4Info ---------------------------------------------
def _synthetic_p4info() -> P4InfoIndex:
    info = p4info_pb2.P4Info()
    action = info.actions.add()
    action.preamble.id, action.preamble.name = 100, "C.hit"
    table = info.tables.add()
    table.preamble.id, table.preamble.name = 200, "C.acl"
    table.action_refs.add(id=100)
    for fid, (name, kind) in enumerate(
        [
            ("t", p4info_pb2.MatchField.TERNARY),
            ("r", p4info_pb2.MatchField.RANGE),
            ("o", p4info_pb2.MatchField.OPTIONAL),
        ],
        start=1,
    ):
        table.match_fields.add(id=fid, name=name, bitwidth=16, match_type=kind)
    return P4InfoIndex(info)


def test_ternary_range_optional() -> None:
    builder = EntityBuilder(_synthetic_p4info())
    entry = builder.table_entry("C.acl", {"t": (0x4C40, 0xFFF0), "r": (10, 300), "o": 0}, "C.hit", priority=5)
    t, r, o = entry.match
    assert (t.ternary.value, t.ternary.mask) == (b"\x4c\x40", b"\xff\xf0")
    assert (r.range.low, r.range.high) == (b"\x0a", b"\x01\x2c")
    assert o.optional.value == b"\x00"
    assert entry.priority == 5
    assert decode_table_entry(builder.p4info, entry).match == {"t": (0x4C40, 0xFFF0), "r": (10, 300), "o": 0}
    assert len(builder.table_entry("C.acl", {"t": (0, 0)}, "C.hit").match) == 0  # mask 0: don't care
    with pytest.raises(P4RuntimeValueError, match="outside the mask"):
        builder.table_entry("C.acl", {"t": (0x4C41, 0xFFF0)}, "C.hit")
    with pytest.raises(P4RuntimeValueError, match=r"expected \(value, mask\)"):
        builder.table_entry("C.acl", {"t": 5}, "C.hit")


# --- the client against a fake server -----------------------------------------------------------------
class _FakeP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Primary is whoever has the highest election id; Write fails every update on table id 0xBAD."""

    def __init__(self) -> None:
        self.highest = 0
        self.written: list[p4runtime_pb2.Update] = []

    def StreamChannel(self, requests, context) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        for request in requests:
            election = request.arbitration.election_id.low
            code = code_pb2.OK if election > self.highest else code_pb2.ALREADY_EXISTS
            self.highest = max(self.highest, election)
            reply = p4runtime_pb2.StreamMessageResponse()
            reply.arbitration.CopyFrom(request.arbitration)
            reply.arbitration.status.code = code
            yield reply

    def SetForwardingPipelineConfig(self, request, context):
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def Write(self, request, context):
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message="batch failed")
        failed = False
        for update in request.updates:
            error = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
            if update.entity.table_entry.table_id == 0xBAD:
                error = p4runtime_pb2.Error(canonical_code=code_pb2.NOT_FOUND, message="no such table")
                failed = True
            else:
                self.written.append(update)
            status.details.add().Pack(error)
        if failed:
            context.abort_with_status(_RichStatus(status))
        return p4runtime_pb2.WriteResponse()

    def Read(self, request, context):
        reply = p4runtime_pb2.ReadResponse()
        for update in self.written:
            reply.entities.append(update.entity)
        yield reply


class _RichStatus(grpc.Status):
    def __init__(self, status: status_pb2.Status) -> None:
        self.code = grpc.StatusCode.UNKNOWN
        self.details = status.message
        self.trailing_metadata = (("grpc-status-details-bin", status.SerializeToString()),)


@pytest.fixture
def fake_server() -> Iterator[tuple[str, _FakeP4Runtime]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = _FakeP4Runtime()
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


def test_client_becomes_primary_writes_and_reads(fake_server: tuple[str, _FakeP4Runtime]) -> None:
    address, servicer = fake_server
    p4info = P4InfoIndex.from_file()
    with P4RuntimeClient(address, device_id=1, election_id=5, timeout=5) as client:
        client.set_pipeline(p4info)
        entry = client.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 9})
        client.insert(entry)
        assert client.read_table("LhcIngress.jobs") == [entry]
        assert client.is_primary
        # A lower election id is refused while the first client holds the stream, or stays a backup.
        with pytest.raises(P4RuntimeError, match="not primary"):
            P4RuntimeClient(address, election_id=2, timeout=5).connect()
        with P4RuntimeClient(address, election_id=3, timeout=5).connect(require_primary=False) as backup:
            assert not backup.is_primary
    assert len(servicer.written) == 1


def test_write_error_names_each_failing_update(fake_server: tuple[str, _FakeP4Runtime]) -> None:
    address, _ = fake_server
    with P4RuntimeClient(address, election_id=1, p4info=P4InfoIndex.from_file(), timeout=5) as client:
        good = client.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 1})
        bad = p4runtime_pb2.TableEntry(table_id=0xBAD)
        with pytest.raises(P4RuntimeError) as caught:
            client.insert(good, bad)
    error = caught.value
    assert error.code == grpc.StatusCode.UNKNOWN
    assert [(e.index, e.code) for e in error.errors] == [(1, code_pb2.NOT_FOUND)]
    assert "update #1: NOT_FOUND: no such table" in str(error)


def test_batches_are_split(fake_server: tuple[str, _FakeP4Runtime]) -> None:
    address, servicer = fake_server
    with P4RuntimeClient(address, p4info=P4InfoIndex.from_file(), timeout=5, batch_size=3) as client:
        entries = [client.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": i}) for i in range(7)]
        client.insert(*entries)
    assert len(servicer.written) == 7


def test_unreachable_server_is_a_clean_error() -> None:
    with pytest.raises(P4RuntimeError, match=r"UNAVAILABLE: no P4Runtime server at 127\.0\.0\.1:1"):
        P4RuntimeClient("127.0.0.1:1", timeout=0.5).connect()


def test_write_errors_index_the_whole_list_across_batches(fake_server: tuple[str, _FakeP4Runtime]) -> None:
    address, servicer = fake_server
    with P4RuntimeClient(address, p4info=P4InfoIndex.from_file(), timeout=5, batch_size=2) as client:
        entries = [client.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": i}) for i in range(6)]
        entries[1] = entries[4] = p4runtime_pb2.TableEntry(table_id=0xBAD)
        with pytest.raises(P4RuntimeError) as caught:
            client.insert(*entries)
    assert [e.index for e in caught.value.errors] == [1, 4]  # not "#1 of batch 0" and "#0 of batch 2"
    assert len(servicer.written) == 4  # every batch was sent


def test_decoded_entries_are_hashable(lhc: EntityBuilder) -> None:
    entry = lhc.table_entry("LhcIngress.ipv4_routes", {"hdr.ipv4.dst_addr": "10.0.0.0/8"}, "LhcIngress.route",
                            {"port": 1, "src_mac": 2, "dst_mac": 3})
    decoded = {decode_table_entry(lhc.p4info, entry), decode_table_entry(lhc.p4info, entry)}
    assert len(decoded) == 1


class _PiLikeServer(_FakeP4Runtime):
    """Answers GetForwardingPipelineConfig before any Set as PI does: FAILED_PRECONDITION."""

    def GetForwardingPipelineConfig(self, request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config set")


def test_no_pipeline_reads_the_same_from_pi_and_from_the_spec() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_PiLikeServer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with P4RuntimeClient(f"127.0.0.1:{port}", timeout=5) as client:
            assert client.get_pipeline() is None
    finally:
        server.stop(grace=None)
