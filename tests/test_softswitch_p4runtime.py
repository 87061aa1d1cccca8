"""softswitch's P4Runtime server over a real local gRPC channel: arbitration, pipeline config, writes,
reads, and the status codes BMv2 (p4lang/PI) gives for each mistake."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina import constants as c
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.p4rt import P4RuntimeClient
from lhc_launch.processes import SoftswitchProcess
from lhc_launch.switch_job import data_frame, job_updates, make_job, table_entry, update
from softswitch.p4info_compare import p4info_differences
from softswitch.pipeline import Pipeline
from softswitch.server import P4RuntimeService, start_server

INDEX = P4InfoIndex.from_file()
DEVICE = 1
INSERT, MODIFY, DELETE = p4v1.Update.INSERT, p4v1.Update.MODIFY, p4v1.Update.DELETE


class Stream:
    """One StreamChannel: send arbitration updates, read what the switch answers."""

    def __init__(self, stub: p4runtime_pb2_grpc.P4RuntimeStub) -> None:
        self._requests: queue.Queue = queue.Queue()
        self.responses: queue.Queue = queue.Queue()
        self._call = stub.StreamChannel(iter(self._requests.get, None))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for response in self._call:
                self.responses.put(response)
        except grpc.RpcError as exc:
            self.responses.put(exc)

    def arbitrate(self, election_id: int, device_id: int = DEVICE) -> None:
        request = p4v1.StreamMessageRequest()
        request.arbitration.device_id = device_id
        request.arbitration.election_id.low = election_id
        self._requests.put(request)

    def next(self) -> p4v1.StreamMessageResponse | grpc.RpcError:
        return self.responses.get(timeout=5)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


@pytest.fixture
def target() -> Iterator[tuple[p4runtime_pb2_grpc.P4RuntimeStub, Pipeline]]:
    pipeline = Pipeline(INDEX)
    service = P4RuntimeService(pipeline, threading.Lock(), INDEX.p4info, DEVICE)
    server, port = start_server(service, "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield p4runtime_pb2_grpc.P4RuntimeStub(channel), pipeline
    channel.close()
    server.stop(grace=0).wait()


def primary(stub: p4runtime_pb2_grpc.P4RuntimeStub, election_id: int = 10) -> Stream:
    stream = Stream(stub)
    stream.arbitrate(election_id)
    assert stream.next().arbitration.status.code == code_pb2.OK
    return stream


def push(stub, p4info: p4info_pb2.P4Info = INDEX.p4info, election_id: int = 10,
         action: int = p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT) -> None:
    request = p4v1.SetForwardingPipelineConfigRequest(device_id=DEVICE, action=action)
    request.election_id.low = election_id
    request.config.p4info.CopyFrom(p4info)
    request.config.p4_device_config = b'{"bmv2": "json accepted as is"}'
    request.config.cookie.cookie = 42
    stub.SetForwardingPipelineConfig(request)


def write(stub, *updates: p4v1.Update, election_id: int = 10) -> None:
    request = p4v1.WriteRequest(device_id=DEVICE, updates=updates)
    request.election_id.low = election_id
    stub.Write(request)


def read(stub, *entities: p4v1.Entity) -> list[p4v1.Entity]:
    return [e for response in stub.Read(p4v1.ReadRequest(device_id=DEVICE, entities=entities))
            for e in response.entities]


def write_errors(exc: grpc.RpcError) -> list[int]:
    """The per-update canonical codes of a failed Write (PI's grpc-status-details-bin)."""
    assert exc.code() == grpc.StatusCode.UNKNOWN
    details = dict(exc.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    assert status.code == code_pb2.UNKNOWN and status.message == exc.details()
    errors = []
    for packed in status.details:
        error = p4v1.Error()
        assert packed.Unpack(error)
        errors.append(error.canonical_code)
    return errors


def refused(stub, *updates: p4v1.Update) -> list[int]:
    with pytest.raises(grpc.RpcError) as info:
        write(stub, *updates)
    return write_errors(info.value)


@pytest.fixture
def configured(target):
    stub, pipeline = target
    stream = primary(stub)
    push(stub)
    yield stub, pipeline
    stream.close()


def jobs_entry(job_id: int = 1, **params: int) -> p4v1.TableEntry:
    values = dict(job_index=1, slot_base=0, slot_count=4, fan_in=2, mcast_grp=1, epoch=1) | params
    return table_entry(INDEX, "LhcIngress.jobs", {"hdr.lhc.job_id": job_id}, "LhcIngress.set_job", **values)


def entity(entry: p4v1.TableEntry | p4v1.CounterEntry | p4v1.MulticastGroupEntry) -> p4v1.Entity:
    result = p4v1.Entity()
    if isinstance(entry, p4v1.TableEntry):
        result.table_entry.CopyFrom(entry)
    elif isinstance(entry, p4v1.CounterEntry):
        result.counter_entry.CopyFrom(entry)
    else:
        result.packet_replication_engine_entry.multicast_group_entry.CopyFrom(entry)
    return result


# --- arbitration -----------------------------------------------------------------------------------
def test_capabilities(target):
    stub, _ = target
    assert stub.Capabilities(p4v1.CapabilitiesRequest()).p4runtime_api_version


def test_arbitration_primary_backup_and_failover(target):
    stub, _ = target
    first = primary(stub, 5)
    second = Stream(stub)
    second.arbitrate(3)
    backup = second.next().arbitration
    assert (backup.status.code, backup.election_id.low) == (code_pb2.ALREADY_EXISTS, 5)
    third = Stream(stub)
    third.arbitrate(9)  # higher: becomes primary, everyone is told
    assert third.next().arbitration.status.code == code_pb2.OK
    assert first.next().arbitration.status.code == code_pb2.ALREADY_EXISTS
    assert second.next().arbitration.election_id.low == 9
    third.close()  # the primary leaves: 5 takes over
    assert first.next().arbitration.status.code == code_pb2.OK
    assert second.next().arbitration.election_id.low == 5
    duplicate = Stream(stub)
    duplicate.arbitrate(5)
    error = duplicate.next()
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    wrong = Stream(stub)
    wrong.arbitrate(7, device_id=DEVICE + 1)
    error = wrong.next()
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND
    first.close()
    second.close()


def test_only_the_primary_writes(target):
    stub, _ = target
    stream = primary(stub, 10)
    push(stub)
    with pytest.raises(grpc.RpcError) as info:
        write(stub, update(INSERT, jobs_entry()), election_id=9)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        push(stub, election_id=11)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stream.close()


def test_without_connections_only_requests_without_election_id_write(target):
    stub, _ = target
    with pytest.raises(grpc.RpcError) as info:
        push(stub, election_id=1)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    request = p4v1.SetForwardingPipelineConfigRequest(
        device_id=DEVICE, action=p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
    request.config.p4info.CopyFrom(INDEX.p4info)
    stub.SetForwardingPipelineConfig(request)  # PI accepts it (handy for grpc_cli)


# --- pipeline config -------------------------------------------------------------------------------
def test_nothing_before_a_pipeline_config(target):
    stub, _ = target
    stream = primary(stub)
    for call in (lambda: write(stub, update(INSERT, jobs_entry())),
                 lambda: read(stub, entity(p4v1.TableEntry()))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    empty = stub.GetForwardingPipelineConfig(p4v1.GetForwardingPipelineConfigRequest(device_id=DEVICE))
    assert not empty.config.HasField("p4info")
    stream.close()


def test_config_round_trip_and_response_types(configured):
    stub, _ = configured
    get = p4v1.GetForwardingPipelineConfigRequest
    full = stub.GetForwardingPipelineConfig(get(device_id=DEVICE)).config
    assert full.p4info == INDEX.p4info and full.cookie.cookie == 42
    assert full.p4_device_config == b'{"bmv2": "json accepted as is"}'
    cookie = stub.GetForwardingPipelineConfig(get(device_id=DEVICE, response_type=get.COOKIE_ONLY)).config
    assert not cookie.HasField("p4info") and not cookie.p4_device_config and cookie.cookie.cookie == 42


def test_a_different_p4info_is_refused_with_every_difference(target):
    stub, _ = target
    stream = primary(stub)
    other = p4info_pb2.P4Info()
    other.CopyFrom(INDEX.p4info)
    other.tables[2].match_fields[0].bitwidth = 8
    other.actions[0].preamble.name = "LhcIngress.renamed"
    with pytest.raises(grpc.RpcError) as info:
        push(stub, other)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = info.value.details()
    assert "match fields is [('hdr.lhc.job_id', 8, 'EXACT')]" in message
    assert "no action LhcIngress.drop" in message and "has action LhcIngress.renamed" in message
    stream.close()


def test_p4info_differences_ignore_ids_but_not_widths():
    renumbered = p4info_pb2.P4Info()
    renumbered.CopyFrom(INDEX.p4info)
    renumbered.tables[0].preamble.id += 1
    assert p4info_differences(INDEX.p4info, renumbered) == []
    renumbered.registers[0].type_spec.bitstring.bit.bitwidth = 17
    renumbered.counters[0].size = 5
    problems = p4info_differences(INDEX.p4info, renumbered)
    assert problems == [
        "counter LhcIngress.lhc_stats: size is 5 (softswitch: 1024)",
        "register LhcIngress.slot_epoch: type is bitstring { bit { bitwidth: 17 } } "
        "(softswitch: bitstring { bit { bitwidth: 16 } })",
    ]


def test_verify_and_save_then_commit(target):
    stub, pipeline = target
    stream = primary(stub)
    action = p4v1.SetForwardingPipelineConfigRequest
    push(stub, action=action.VERIFY)
    push(stub, action=action.VERIFY_AND_SAVE)
    assert not pipeline.configured
    push(stub, action=action.COMMIT)
    assert pipeline.configured
    stream.close()


def test_reconcile_keeps_state_and_commit_resets_it(configured):
    stub, _ = configured
    write(stub, update(INSERT, jobs_entry()))
    push(stub, action=p4v1.SetForwardingPipelineConfigRequest.RECONCILE_AND_COMMIT)
    assert len(read(stub, entity(p4v1.TableEntry(table_id=INDEX.table("LhcIngress.jobs").id)))) == 1
    push(stub)
    assert read(stub, entity(p4v1.TableEntry())) == []


# --- table entries ---------------------------------------------------------------------------------
def test_insert_read_modify_delete(configured):
    stub, pipeline = configured
    entry = jobs_entry(7, epoch=3)
    write(stub, update(INSERT, entry))
    assert read(stub, entity(entry))[0].table_entry == entry  # canonical values read back equal
    assert pipeline.jobs.entries[7] == ("LhcIngress.set_job", 1, 0, 4, 2, 1, 3)
    write(stub, update(MODIFY, jobs_entry(7, epoch=4)))
    [got] = read(stub, entity(p4v1.TableEntry(table_id=INDEX.table("LhcIngress.jobs").id)))
    assert got.table_entry == jobs_entry(7, epoch=4)
    write(stub, update(DELETE, jobs_entry(7)))
    assert read(stub, entity(p4v1.TableEntry())) == []
    assert read(stub, entity(jobs_entry(7))) == []  # one missing entry reads as nothing


def test_wildcard_read_returns_every_table_and_lpm_entries(configured):
    stub, _ = configured
    job = make_job(3, 2, 2)
    write(stub, *job_updates(INDEX, job))
    route = table_entry(INDEX, "LhcIngress.ipv4_routes", {"hdr.ipv4.dst_addr": (0x0A010000, 16)},
                        "LhcIngress.route", port=2, src_mac=1, dst_mac=2)
    write(stub, update(INSERT, route))
    entries = [e.table_entry for e in read(stub, entity(p4v1.TableEntry()))]
    assert len(entries) == 1 + 2 + 2 + 1 and route in entries
    groups = read(stub, entity(p4v1.MulticastGroupEntry()))
    assert [g.packet_replication_engine_entry.multicast_group_entry.multicast_group_id for g in groups] == [3]


def test_default_entry_reads_and_const_default_cannot_change(configured):
    stub, _ = configured
    table_id = INDEX.table("LhcIngress.jobs").id
    [default] = read(stub, entity(p4v1.TableEntry(table_id=table_id, is_default_action=True)))
    assert default.table_entry.action.action.action_id == INDEX.action("LhcIngress.unknown_job").id
    change = p4v1.TableEntry(table_id=table_id, is_default_action=True)
    change.action.action.action_id = INDEX.action("LhcIngress.unknown_job").id
    assert refused(stub, update(MODIFY, change)) == [code_pb2.PERMISSION_DENIED]


def test_write_errors_carry_pi_codes_per_update(configured):
    stub, _ = configured
    write(stub, update(INSERT, jobs_entry(1)))
    unknown_table = jobs_entry(2)
    unknown_table.table_id = 12345
    too_wide = jobs_entry(3)
    too_wide.match[0].exact.value = b"\x01\x00\x00"
    bad_param = jobs_entry(4)
    bad_param.action.action.params[0].param_id = 99
    wide_param = jobs_entry(5)
    wide_param.action.action.params[0].value = b"\x01\x00"
    default_only = table_entry(INDEX, "LhcIngress.jobs", {"hdr.lhc.job_id": 6}, "LhcIngress.unknown_job")
    other_tables_action = table_entry(INDEX, "LhcIngress.jobs", {"hdr.lhc.job_id": 7}, "LhcIngress.set_port",
                                      port=1)
    unknown_action = jobs_entry(8)
    unknown_action.action.action.action_id = 777
    priority = jobs_entry(9)
    priority.priority = 10
    missing_field = jobs_entry(10)
    del missing_field.match[:]
    missing_field.match.add(field_id=99).exact.value = b"\x01"
    codes = refused(
        stub,
        update(INSERT, jobs_entry(1)),       # duplicate
        update(MODIFY, jobs_entry(50)),      # missing
        update(DELETE, jobs_entry(51)),      # missing
        update(INSERT, unknown_table),
        update(INSERT, too_wide),
        update(INSERT, bad_param),
        update(INSERT, wide_param),
        update(INSERT, default_only),
        update(INSERT, other_tables_action),
        update(INSERT, unknown_action),
        update(INSERT, priority),
        update(INSERT, missing_field),
        update(INSERT, jobs_entry(60)),      # fine: applied, reported OK
    )
    exists, missing, bad, denied = (code_pb2.ALREADY_EXISTS, code_pb2.NOT_FOUND, code_pb2.INVALID_ARGUMENT,
                                    code_pb2.PERMISSION_DENIED)
    assert codes == [exists, missing, missing, bad, bad, bad, bad, denied, bad, bad, bad, bad, code_pb2.OK]
    assert len(read(stub, entity(p4v1.TableEntry()))) == 2


def test_lpm_values_are_checked_like_pi(configured):
    stub, _ = configured

    def route(value: int, prefix: int) -> p4v1.Update:
        return update(INSERT, table_entry(INDEX, "LhcIngress.ipv4_routes",
                                          {"hdr.ipv4.dst_addr": (value, prefix)},
                                          "LhcIngress.route", port=1, src_mac=1, dst_mac=2))

    assert refused(stub, route(0x0A000001, 24), route(0, 0), route(0x0A000000, 33)) == [
        code_pb2.INVALID_ARGUMENT] * 3


def test_a_full_table_refuses_more(configured):
    stub, _ = configured
    write(stub, *(update(INSERT, jobs_entry(i)) for i in range(c.MAX_JOBS)))
    assert refused(stub, update(INSERT, jobs_entry(999))) == [code_pb2.UNKNOWN]


# --- multicast groups, counters, registers ---------------------------------------------------------
def test_multicast_groups(configured):
    stub, pipeline = configured
    group = p4v1.MulticastGroupEntry(multicast_group_id=5)
    group.replicas.add(egress_port=2, instance=1)
    group.replicas.add(egress_port=1, instance=0)
    write(stub, update(INSERT, group))
    assert pipeline.pre.groups[5] == ((1, 0), (2, 1))
    [got] = read(stub, entity(p4v1.MulticastGroupEntry(multicast_group_id=5)))
    replicas = got.packet_replication_engine_entry.multicast_group_entry.replicas
    assert [(r.instance, r.egress_port) for r in replicas] == [(0, 1), (1, 2)]
    group.replicas.add(egress_port=3, instance=2)
    write(stub, update(MODIFY, group))
    assert len(pipeline.pre.groups[5]) == 3
    twice = p4v1.MulticastGroupEntry(multicast_group_id=6)
    twice.replicas.add(egress_port=1, instance=0)
    twice.replicas.add(egress_port=1, instance=0)
    group_id = p4v1.MulticastGroupEntry
    codes = refused(stub, update(INSERT, group), update(MODIFY, group_id(multicast_group_id=9)),
                    update(INSERT, group_id(multicast_group_id=0)),
                    update(INSERT, group_id(multicast_group_id=1 << 15)), update(INSERT, twice))
    assert codes == [code_pb2.ALREADY_EXISTS, code_pb2.NOT_FOUND, code_pb2.INVALID_ARGUMENT,
                     code_pb2.OUT_OF_RANGE, code_pb2.INVALID_ARGUMENT]
    write(stub, update(DELETE, group))
    assert pipeline.pre.groups == {}
    with pytest.raises(grpc.RpcError) as info:
        read(stub, entity(p4v1.MulticastGroupEntry(multicast_group_id=5)))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_counters_read_one_or_all_and_modify(configured):
    stub, pipeline = configured
    job = make_job(1, 1, 1)
    write(stub, *job_updates(INDEX, job))
    pipeline.inject(data_frame(job, 0, [1] * c.LANES), 1)
    counter_id = INDEX.counter("LhcIngress.lhc_stats").id
    cell = 1 * c.NUM_STATS + c.Stat.RESULT
    one = p4v1.CounterEntry(counter_id=counter_id)
    one.index.index = cell
    [got] = read(stub, entity(one))
    assert (got.counter_entry.data.packet_count, got.counter_entry.data.byte_count) == (1, c.FRAME_BYTES)
    everything = read(stub, entity(p4v1.CounterEntry(counter_id=counter_id)))
    assert len(everything) == c.MAX_JOBS * c.NUM_STATS
    assert sum(e.counter_entry.data.packet_count for e in everything) == 1
    reset = p4v1.CounterEntry(counter_id=counter_id)
    reset.index.index = cell
    up = p4v1.Update(type=MODIFY)
    up.entity.counter_entry.CopyFrom(reset)
    write(stub, up)
    assert read(stub, entity(one))[0].counter_entry.data.packet_count == 0
    one.index.index = c.MAX_JOBS * c.NUM_STATS
    with pytest.raises(grpc.RpcError) as info:
        read(stub, entity(one))
    assert info.value.code() == grpc.StatusCode.UNKNOWN


def test_registers_are_unimplemented_as_on_bmv2(configured):
    stub, _ = configured
    register = p4v1.Entity()
    register.register_entry.register_id = INDEX.register("LhcIngress.slot_epoch").id
    with pytest.raises(grpc.RpcError) as info:
        read(stub, register)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    up = p4v1.Update(type=MODIFY)
    up.entity.CopyFrom(register)
    assert refused(stub, up) == [code_pb2.UNIMPLEMENTED]


def test_an_entity_of_no_kind_is_refused_both_ways(configured):
    """A read or an update whose Entity names no kind is UNKNOWN, said as such (PI's "Incorrect entity
    type")."""
    stub, _ = configured
    with pytest.raises(grpc.RpcError) as info:
        read(stub, p4v1.Entity())
    assert info.value.code() == grpc.StatusCode.UNKNOWN and "names no entity" in info.value.details()
    assert refused(stub, p4v1.Update(type=MODIFY, entity=p4v1.Entity())) == [code_pb2.UNKNOWN]


def test_text_format_entries_from_a_client_work_unchanged(configured):
    """An entry as p4runtime-sh would print it (non-canonical, zero-padded values) is accepted."""
    stub, pipeline = configured
    entry = text_format.Parse(
        f'table_id: {INDEX.table("LhcIngress.jobs").id} '
        'match { field_id: 1 exact { value: "\\000\\005" } } '
        f'action {{ action {{ action_id: {INDEX.action("LhcIngress.set_job").id} '
        + " ".join(f'params {{ param_id: {i} value: "\\000\\00{i}" }}' for i in range(1, 7))
        + " } }", p4v1.TableEntry())
    write(stub, update(INSERT, entry))
    assert pipeline.jobs.entries[5] == ("LhcIngress.set_job", 1, 2, 3, 4, 5, 6)


def test_sigterm_ends_the_process_while_a_controller_holds_its_stream():
    """A primary's StreamChannel stays open while the switch is told to stop: the process still exits
    promptly and cleanly (a stream handler blocked for good would hold the exit)."""
    with SoftswitchProcess() as switch:
        client = P4RuntimeClient(switch.grpc_addr, device_id=1, election_id=1).connect()
        try:
            assert switch.terminate(timeout=10) == 0
        finally:
            client.close()
