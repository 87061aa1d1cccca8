"""Per-target pipeline material (the Tofino device config's layout), and a switch that runs another
pipeline: the controller refuses to touch it and says why."""

from __future__ import annotations

import struct
import time

import grpc
import pytest
from p4.v1 import p4runtime_pb2 as p4v1

from controller.targets import TNA_FIELD_NAMES, load_target
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.p4rt import P4RuntimeClient
from lhc_ina.tofino import TofinoBundleError, TofinoDeviceConfig, main
from lhc_launch.processes import ControllerProcess, SoftswitchProcess


def test_tofino_device_config_layout(tmp_path):
    bundle = TofinoDeviceConfig("lhc", b"\x01\x02bin", b'{"ctx": 1}', "pipe", b'{"bfrt": 2}').pack()
    expected = b"".join(
        struct.pack("<I", len(p)) + p
        for p in (b"lhc", b"\x01\x02bin", b'{"ctx": 1}', b"pipe", b'{"bfrt": 2}')
    )
    assert bundle == expected
    assert bundle[:7] == b"\x03\x00\x00\x00lhc"  # little-endian length, then the program name
    assert TofinoDeviceConfig.unpack(bundle).context_json == b'{"ctx": 1}'
    with pytest.raises(TofinoBundleError, match="8 bytes announced, 3 left"):
        TofinoDeviceConfig.unpack(b"\x08\x00\x00\x00abc")
    with pytest.raises(TofinoBundleError, match="1 chunks"):
        TofinoDeviceConfig.unpack(b"\x01\x00\x00\x00a")


def test_tofino_bundle_from_a_bf_p4c_output_dir(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert "missing" in capsys.readouterr().err
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "tofino.bin").write_bytes(b"BIN")
    (tmp_path / "pipe" / "context.json").write_text("{}")
    (tmp_path / "bf-rt.json").write_text('{"tables": []}')  # the name some drivers use
    assert main([str(tmp_path)]) == 0
    parsed = TofinoDeviceConfig.unpack((tmp_path / "lhc.device_config.bin").read_bytes())
    assert (parsed.program, parsed.tofino_bin, parsed.pipe, parsed.bfrt_json) == (
        "lhc",
        b"BIN",
        "pipe",
        b'{"tables": []}',
    )


def test_targets_name_what_is_missing(tmp_path):
    assert load_target("softswitch").device_config == b""
    with pytest.raises(ControllerError, match=r"lhc\.json not found"):
        load_target("bmv2", device_config=tmp_path / "lhc.json")
    with pytest.raises(ControllerError, match=r"P4Info .* not found"):
        load_target("tofino", p4info=tmp_path / "none.txtpb")
    with pytest.raises(ControllerError, match="unknown target"):
        load_target("ebpf")


@pytest.mark.timeout(120)
def test_a_switch_running_another_pipeline_is_left_alone(tmp_path):
    with SoftswitchProcess() as sw:
        # Someone loads the same program compiled with other ids (softswitch accepts any ids).
        p4info = load_target("softswitch").p4info.p4info.__class__()
        p4info.CopyFrom(load_target("softswitch").p4info.p4info)
        jobs = next(t for t in p4info.tables if t.preamble.name == "LhcIngress.jobs")
        jobs.preamble.id += 77
        request = p4v1.SetForwardingPipelineConfigRequest(
            device_id=1, action=p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
        )
        request.config.p4info.CopyFrom(p4info)
        observer = P4RuntimeClient(sw.grpc_addr)
        observer.connect(arbitrate=False)
        observer.stub.SetForwardingPipelineConfig(request)
        with ControllerProcess(sw, tmp_path) as ctl:
            deadline = time.monotonic() + 60
            while "mismatch" not in ctl.client.switch_status().state and time.monotonic() < deadline:
                time.sleep(0.1)
            status = ctl.client.switch_status()
            assert "pipeline mismatch" in status.state and "LhcIngress.jobs" in status.last_error
            with pytest.raises(ControllerError) as info:
                ctl.client.create_job("j", workers=1)
            assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "different pipeline" in info.value.message and "LhcIngress.jobs" in info.value.message
            assert status.updates_written == 0
        # The foreign pipeline is still there, untouched.
        loaded, _ = observer.get_pipeline()
        assert next(t for t in loaded.tables if t.preamble.name == "LhcIngress.jobs").preamble.id == (
            jobs.preamble.id
        )
        observer.close()


def test_tofino_admission_keeps_a_job_on_one_pipe():
    from dataclasses import replace

    from controller.admission import check_member, resolve_member
    from controller.records import JobRecord, JobState

    tofino = replace(load_target("softswitch"), name="tofino", pipe_shift=7)
    job = JobRecord(1, "j", JobState.PENDING, 3, 0, 8, 64, 1, 1, 10, 10, 0)
    first = resolve_member("a", "", "10.0.0.1", 4000, "", 5, None, None)
    job = replace(job, members=(first,))
    check_member(job, resolve_member("b", "", "10.0.0.2", 4000, "", 127, None, None), tofino)  # pipe 0
    other_pipe = resolve_member("c", "", "10.0.0.3", 4000, "", 128, None, None)
    with pytest.raises(ControllerError, match=r"port 128 \(pipe 1\).*pipe 0.*share one pipe"):
        check_member(job, other_pipe, tofino)
    check_member(job, other_pipe, load_target("softswitch"))  # one pipe only on Tofino


def test_tofino_target_takes_bf_p4c_names(tmp_path):
    """bf-p4c's P4Info (pipe-qualified names, TNA's egress_rid field): the controller builds its entries
    from it by the names it uses everywhere, and pushes and compares bf-p4c's P4Info unchanged."""
    from google.protobuf import text_format

    from controller.reconcile import SwitchState, desired_state, plan
    from lhc_ina.p4rt import decode_table_entry
    from tests.harness.controller import two_worker_job

    p4info = type(load_target("softswitch").p4info.p4info)()
    p4info.CopyFrom(load_target("softswitch").p4info.p4info)
    for kind in ("tables", "actions", "counters", "registers"):
        for entity in getattr(p4info, kind):
            entity.preamble.name = "pipe." + entity.preamble.name
    for table in p4info.tables:
        for match in table.match_fields:
            match.name = TNA_FIELD_NAMES.get(match.name, match.name)
    (tmp_path / "p4info.txtpb").write_text(text_format.MessageToString(p4info))
    (tmp_path / "bundle.bin").write_bytes(b"device data")
    tofino = load_target("tofino", tmp_path / "p4info.txtpb", tmp_path / "bundle.bin")
    assert tofino.p4info.p4info == p4info and tofino.device_config == b"device data"
    jobs = next(t for t in p4info.tables if t.preamble.name == "pipe.LhcIngress.jobs")
    assert tofino.p4info.table("LhcIngress.jobs").id == jobs.preamble.id
    updates = plan(desired_state([two_worker_job()], None), SwitchState(frozenset(), frozenset()), tofino)
    decoded = [decode_table_entry(tofino.p4info, u.entity.table_entry) for u in updates
               if u.entity.HasField("table_entry")]
    assert {d.table for d in decoded} == {"LhcIngress.jobs", "LhcIngress.workers", "LhcEgress.replicas"}
    assert all("eg_intr_md.egress_rid" in d.match for d in decoded if d.table == "LhcEgress.replicas")
    assert all("ig_intr_md.ingress_port" in d.match for d in decoded if d.table == "LhcIngress.workers")
    group = next(u for u in updates if u.entity.HasField("packet_replication_engine_entry"))
    replica = group.entity.packet_replication_engine_entry.multicast_group_entry.replicas[0]
    assert replica.WhichOneof("port_kind") == "egress_port"  # the field PI's Tofino backend reads
