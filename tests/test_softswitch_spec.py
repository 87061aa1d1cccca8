"""softswitch against the P4Runtime specification (v1.5), where PI (BMv2's and Tofino's server) departs
from it: the spec is the judge. docs/softswitch.md lists each case."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina.p4info import P4InfoIndex
from softswitch.pipeline import Pipeline
from softswitch.server import P4RuntimeService, start_server

INDEX = P4InfoIndex.from_file()
DEVICE = 1
_SET = p4v1.SetForwardingPipelineConfigRequest


@pytest.fixture
def stub() -> Iterator[p4runtime_pb2_grpc.P4RuntimeStub]:
    service = P4RuntimeService(Pipeline(INDEX), threading.Lock(), INDEX.p4info, DEVICE)
    server, port = start_server(service, "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield p4runtime_pb2_grpc.P4RuntimeStub(channel)
    channel.close()
    server.stop(grace=0).wait()


def _push(stub, action: int, p4info: p4info_pb2.P4Info | None = INDEX.p4info, device: int = DEVICE) -> None:
    request = _SET(device_id=device, action=action)  # no election id: allowed while no stream is open
    if p4info is not None:
        request.config.p4info.CopyFrom(p4info)
    stub.SetForwardingPipelineConfig(request)


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details(), info.value


def _update_error(error: grpc.RpcError) -> tuple[int, str]:
    details = dict(error.trailing_metadata())["grpc-status-details-bin"]
    p4_error = p4v1.Error()
    status_pb2.Status.FromString(details).details[0].Unpack(p4_error)
    return p4_error.canonical_code, p4_error.message


def _read_and_write_refused(
    stub, entity: p4v1.Entity, update_type: int
) -> tuple[tuple[grpc.StatusCode, str], tuple[int, str]]:
    """A Read of ``entity`` and a Write of it, both refused: (gRPC code, details) of the read, (canonical
    code, message) of the write's one update."""
    code, details, _ = _code(lambda: list(stub.Read(p4v1.ReadRequest(device_id=DEVICE, entities=[entity]))))
    update = p4v1.Update(type=update_type, entity=entity)
    _, _, error = _code(lambda: stub.Write(p4v1.WriteRequest(device_id=DEVICE, updates=[update])))
    return (code, details), _update_error(error)


def test_commit_without_a_saved_config_is_not_found(stub):
    code, details, _ = _code(lambda: _push(stub, _SET.COMMIT, None))
    assert code == grpc.StatusCode.NOT_FOUND and "VERIFY_AND_SAVE" in details  # PI: FAILED_PRECONDITION


def test_get_before_any_set_is_ok_with_config_unset(stub):
    reply = stub.GetForwardingPipelineConfig(p4v1.GetForwardingPipelineConfigRequest(device_id=DEVICE))
    assert not reply.HasField("config")  # PI: FAILED_PRECONDITION


def test_unknown_device_is_not_found_everywhere(stub):
    other = DEVICE + 7
    calls = [
        lambda: stub.GetForwardingPipelineConfig(p4v1.GetForwardingPipelineConfigRequest(device_id=other)),
        lambda: stub.Write(p4v1.WriteRequest(device_id=other)),
        lambda: list(stub.Read(p4v1.ReadRequest(device_id=other, entities=[p4v1.Entity()]))),
        lambda: _push(stub, _SET.VERIFY_AND_COMMIT, device=other),
    ]
    for call in calls:
        assert _code(call)[0] == grpc.StatusCode.NOT_FOUND


def test_p4info_with_a_dangling_action_reference_is_rejected(stub):
    broken = p4info_pb2.P4Info()
    broken.CopyFrom(INDEX.p4info)
    broken.tables[0].action_refs.add(id=0x01FFFFFF)
    code, _, _ = _code(lambda: _push(stub, _SET.VERIFY_AND_COMMIT, broken))
    assert code == grpc.StatusCode.INVALID_ARGUMENT  # PI accepts it


def test_direct_counter_of_a_table_without_one_is_invalid_argument(stub):
    _push(stub, _SET.VERIFY_AND_COMMIT)
    entity = p4v1.Entity()
    entity.direct_counter_entry.table_entry.table_id = INDEX.table("LhcIngress.jobs").id
    (code, details), (update_code, message) = _read_and_write_refused(stub, entity, p4v1.Update.MODIFY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "LhcIngress.jobs has no direct counter" in details
    assert update_code == code_pb2.INVALID_ARGUMENT and "has no direct counter" in message


def test_clone_sessions_are_refused_by_name(stub):
    _push(stub, _SET.VERIFY_AND_COMMIT)
    entity = p4v1.Entity()
    entity.packet_replication_engine_entry.clone_session_entry.session_id = 5
    (code, details), (update_code, message) = _read_and_write_refused(stub, entity, p4v1.Update.INSERT)
    assert code == grpc.StatusCode.UNIMPLEMENTED and "clone sessions" in details
    assert update_code == code_pb2.UNIMPLEMENTED and "clone_session_entry" in message
