"""The P4Runtime service of softswitch (grpcio over the ``p4runtime`` protos).

It serves the subset lhc-ina uses, with the behaviour of BMv2's simple_switch_grpc (p4lang/PI's server):

- StreamChannel: master arbitration (``arbitration``); packet-out is answered with a StreamError, since
  the program has no CPU port.
- SetForwardingPipelineConfig: VERIFY, VERIFY_AND_SAVE, COMMIT, VERIFY_AND_COMMIT, RECONCILE_AND_COMMIT.
  The P4Info must be the one softswitch implements (``p4info_compare``; INVALID_ARGUMENT lists every
  difference); any device config blob (the BMv2 JSON, or nothing) is accepted and kept, so the same client
  code configures both targets. Committing resets tables, groups, registers and counters; RECONCILE keeps
  them when the P4Info is unchanged.
- GetForwardingPipelineConfig: what was committed (empty before any commit, as PI).
- Write: table entries (incl. MODIFY of a non-const default), PRE multicast groups, counter cells.
  Failures are reported the PI way: status UNKNOWN whose details (``grpc-status-details-bin``) hold one
  ``p4.v1.Error`` per update, OK for the ones that were applied (CONTINUE_ON_ERROR; other atomicity
  modes: UNIMPLEMENTED). Not primary: PERMISSION_DENIED. No pipeline yet: FAILED_PRECONDITION.
- Read: table entries (wildcards, default entry), multicast groups, counter cells (one index or all).
  A refused read fails the RPC with that code (register reads: UNIMPLEMENTED).
- Capabilities.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from importlib import metadata

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina.tls import TlsConfig, add_port
from softswitch import entity_reads
from softswitch.arbitration import Arbitration, Connection
from softswitch.entity_store import Entities
from softswitch.errors import SwitchError
from softswitch.p4info_compare import p4info_differences
from softswitch.pipeline import Pipeline

log = logging.getLogger(__name__)
#: How often a StreamChannel handler waiting for its next message checks that its RPC still lives.
_OUTBOX_POLL_S = 0.5

_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}
_SetAction = p4v1.SetForwardingPipelineConfigRequest
_GetType = p4v1.GetForwardingPipelineConfigRequest


def _api_version() -> str:
    try:
        return metadata.version("p4runtime")
    except metadata.PackageNotFoundError:
        return "1.3.0"


class _RpcStatus(grpc.Status):
    """A status with trailing metadata, for ``abort_with_status`` (what grpcio-status builds)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


@dataclass
class _Config:
    config: p4v1.ForwardingPipelineConfig
    entities: Entities


class P4RuntimeService(p4runtime_pb2_grpc.P4RuntimeServicer):
    """P4Runtime for one device, the pipeline ``pipeline``, whose state ``lock`` guards."""

    def __init__(self, pipeline: Pipeline, lock: threading.Lock, implemented: p4info_pb2.P4Info,
                 device_id: int) -> None:
        self.pipeline = pipeline
        self.lock = lock
        self.implemented = implemented
        self.device_id = device_id
        self.arbitration = Arbitration(device_id)
        self.committed: _Config | None = None
        self.saved: p4v1.ForwardingPipelineConfig | None = None

    # --- helpers -----------------------------------------------------------------------------------
    def _fail(self, context: grpc.ServicerContext, code: int, message: str) -> None:
        context.abort(_GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN), message)

    def _check_device(self, device_id: int, context: grpc.ServicerContext) -> None:
        if device_id != self.device_id:
            self._fail(context, code_pb2.NOT_FOUND,
                       f"no device {device_id}: this softswitch is device {self.device_id}")

    def _check_primary(self, request: p4v1.WriteRequest | _SetAction, context: grpc.ServicerContext) -> None:
        if not self.arbitration.may_write(request.HasField("election_id"), request.election_id):
            self._fail(context, code_pb2.PERMISSION_DENIED, "Not primary")

    def _entities(self, context: grpc.ServicerContext) -> Entities:
        if self.committed is None:
            self._fail(context, code_pb2.FAILED_PRECONDITION,
                       "No forwarding pipeline config set for this device")
        assert self.committed is not None
        return self.committed.entities

    # --- RPCs --------------------------------------------------------------------------------------
    def Write(self, request: p4v1.WriteRequest, context: grpc.ServicerContext) -> p4v1.WriteResponse:
        self._check_device(request.device_id, context)
        self._check_primary(request, context)
        entities = self._entities(context)
        if request.atomicity != p4v1.WriteRequest.CONTINUE_ON_ERROR:
            self._fail(context, code_pb2.UNIMPLEMENTED,
                       "Support for atomic write modes has not been implemented yet")
        errors: list[SwitchError | None] = []
        with self.lock:
            for update in request.updates:
                try:
                    entities.write(update)
                    errors.append(None)
                except SwitchError as exc:
                    errors.append(exc)
        failed = [(i, e) for i, e in enumerate(errors) if e is not None]
        if failed:
            summary = "; ".join(f"update {i}: {e}" for i, e in failed)
            message = f"{len(failed)} of {len(errors)} updates failed: {summary}"
            log.info("Write refused: %s", message)
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message=message)
            for error in errors:
                detail = p4v1.Error(canonical_code=code_pb2.OK) if error is None else p4v1.Error(
                    canonical_code=error.code, message=error.message, space="ALL-sswitch-p4org")
                packed = any_pb2.Any()
                packed.Pack(detail)
                status.details.append(packed)
            context.abort_with_status(_RpcStatus(
                grpc.StatusCode.UNKNOWN, message, (("grpc-status-details-bin", status.SerializeToString()),)
            ))
        return p4v1.WriteResponse()

    def Read(self, request: p4v1.ReadRequest, context: grpc.ServicerContext) -> Iterator[p4v1.ReadResponse]:
        self._check_device(request.device_id, context)
        entities = self._entities(context)
        response = p4v1.ReadResponse()
        try:
            with self.lock:
                for entity in request.entities:
                    entity_reads.read(entities, entity, response)
        except SwitchError as exc:
            self._fail(context, exc.code, exc.message)
        yield response

    def SetForwardingPipelineConfig(
        self, request: _SetAction, context: grpc.ServicerContext
    ) -> p4v1.SetForwardingPipelineConfigResponse:
        self._check_device(request.device_id, context)
        self._check_primary(request, context)
        action = request.action
        if action == _SetAction.UNSPECIFIED:
            self._fail(context, code_pb2.INVALID_ARGUMENT, "Invalid SetForwardingPipeline action")
        if action == _SetAction.COMMIT:
            if self.saved is None:
                # The spec: "If no saved config exists, return NOT_FOUND" (PI says FAILED_PRECONDITION).
                self._fail(context, code_pb2.NOT_FOUND, "COMMIT without a config saved by VERIFY_AND_SAVE")
            assert self.saved is not None
            self._commit(self.saved, keep_state=False)
            self.saved = None
            return p4v1.SetForwardingPipelineConfigResponse()
        if action not in (_SetAction.VERIFY, _SetAction.VERIFY_AND_SAVE, _SetAction.VERIFY_AND_COMMIT,
                          _SetAction.RECONCILE_AND_COMMIT):
            self._fail(context, code_pb2.INVALID_ARGUMENT, f"invalid SetForwardingPipeline action {action}")
        problems = p4info_differences(self.implemented, request.config.p4info)
        if problems:
            message = "the P4Info is not the program softswitch implements: " + "; ".join(problems)
            log.warning("%s", message)
            self._fail(context, code_pb2.INVALID_ARGUMENT, message)
        if action == _SetAction.VERIFY_AND_SAVE:
            self.saved = p4v1.ForwardingPipelineConfig()
            self.saved.CopyFrom(request.config)
        elif action != _SetAction.VERIFY:
            keep = (action == _SetAction.RECONCILE_AND_COMMIT and self.committed is not None
                    and self.committed.config.p4info == request.config.p4info)
            self._commit(request.config, keep_state=keep)
        return p4v1.SetForwardingPipelineConfigResponse()

    def _commit(self, config: p4v1.ForwardingPipelineConfig, keep_state: bool) -> None:
        stored = p4v1.ForwardingPipelineConfig()
        stored.CopyFrom(config)
        with self.lock:
            if keep_state and self.committed is not None:
                self.committed.config = stored
            else:
                self.pipeline.reset()
                self.committed = _Config(stored, Entities(self.pipeline, stored.p4info))
            self.pipeline.configured = True
        log.info("pipeline committed (%s)", "state kept" if keep_state else "fresh state")

    def GetForwardingPipelineConfig(
        self, request: _GetType, context: grpc.ServicerContext
    ) -> p4v1.GetForwardingPipelineConfigResponse:
        self._check_device(request.device_id, context)
        response = p4v1.GetForwardingPipelineConfigResponse()
        if self.committed is None:
            return response
        committed, out = self.committed.config, response.config
        kind = request.response_type
        if kind not in (_GetType.ALL, _GetType.COOKIE_ONLY, _GetType.P4INFO_AND_COOKIE,
                        _GetType.DEVICE_CONFIG_AND_COOKIE):
            self._fail(context, code_pb2.INVALID_ARGUMENT,
                       "Invalid response_type in GetForwardingPipelineConfigRequest")
        if kind in (_GetType.ALL, _GetType.P4INFO_AND_COOKIE):
            out.p4info.CopyFrom(committed.p4info)
        if kind in (_GetType.ALL, _GetType.DEVICE_CONFIG_AND_COOKIE):
            out.p4_device_config = committed.p4_device_config
        if committed.HasField("cookie"):
            out.cookie.CopyFrom(committed.cookie)
        return response

    def Capabilities(self, request: p4v1.CapabilitiesRequest,
                     context: grpc.ServicerContext) -> p4v1.CapabilitiesResponse:
        return p4v1.CapabilitiesResponse(p4runtime_api_version=_api_version())

    def StreamChannel(self, request_iterator: Iterator[p4v1.StreamMessageRequest],
                      context: grpc.ServicerContext) -> Iterator[p4v1.StreamMessageResponse]:
        conn = Connection()
        threading.Thread(target=self._read_stream, args=(conn, request_iterator),
                         name="p4rt-stream", daemon=True).start()
        try:
            # Polled, so that the handler ends with its RPC even if the reader thread never wakes: a handler
            # blocked here for good would hold one of the server's threads, and the process's exit with it.
            while context.is_active():
                try:
                    item = conn.outbox.get(timeout=_OUTBOX_POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                if isinstance(item, SwitchError):
                    self._fail(context, item.code, item.message)
                yield item
        finally:
            self.arbitration.leave(conn)

    def _read_stream(self, conn: Connection, requests: Iterator[p4v1.StreamMessageRequest]) -> None:
        """Consume one StreamChannel's requests; answers go to the connection's outbox."""
        try:
            for request in requests:
                kind = request.WhichOneof("update")
                if kind == "arbitration":
                    self.arbitration.update(conn, request.arbitration)
                elif kind == "packet" and self.arbitration.is_primary(conn):
                    response = p4v1.StreamMessageResponse()
                    response.error.canonical_code = code_pb2.UNIMPLEMENTED
                    response.error.message = "softswitch has no CPU port: packet-out is not supported"
                    response.error.packet_out.packet_out.CopyFrom(request.packet)
                    conn.outbox.put(response)
        except SwitchError as exc:
            conn.outbox.put(exc)
        except grpc.RpcError:
            pass  # the client went away or the server is stopping
        finally:
            conn.outbox.put(None)


def start_server(service: P4RuntimeService, address: str, workers: int = 24, *,
                 tls: TlsConfig | None = None) -> tuple[grpc.Server, int]:
    """Serve ``service`` on ``address`` ("HOST:PORT", port 0 picks one); the server and its bound port.
    With ``tls`` it serves TLS, and with a CA in it only to clients whose certificate that CA signed
    (mutual TLS: the switch then knows its controllers, as P4Runtime expects)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="p4rt"))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service, server)
    try:
        port = add_port(server, address, tls, require_client_cert=tls is not None and tls.ca is not None)
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    server.start()
    return server, port
