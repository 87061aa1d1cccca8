"""``lhc-controller``: run the controller, or drive a running one.

    lhc-controller serve --switch ADDR --target T --listen ADDR --state-dir DIR [--topology F] ...
    lhc-controller [--controller ADDR] [--token-file F] [--tls-ca PEM] [--json] job create NAME --workers W
    lhc-controller ... job list | job show NAME | job delete NAME | switch status

``--token-file`` (default ``$LHC_TOKEN_FILE``) holds the operator's token or a job credential; ``--tls-ca``
and the other TLS flags default to ``LHC_TLS_*`` (``lhc_ina.tls``). ``job create`` shows the new job's
credential once (or writes it to ``--credential-file``).

Exit codes: 0 done; 2 bad usage or request (INVALID_ARGUMENT); 3 no such job (NOT_FOUND); 4 refused
(ALREADY_EXISTS, RESOURCE_EXHAUSTED, FAILED_PRECONDITION); 5 unauthenticated or not allowed
(UNAUTHENTICATED, PERMISSION_DENIED); 6 controller unreachable; 7 (switch status) the controller is not
the switch's connected primary, or the switch runs another pipeline; 1 anything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from google.protobuf import json_format

from controller.server import add_serve_arguments, serve
from lhc_ina import tls
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice.client import DEFAULT_CONTROLLER, TOKEN_FILE_ENV, JobClient, read_token
from lhc_ina.jobservice.errors import ControllerError

_EXIT = {
    grpc.StatusCode.INVALID_ARGUMENT: 2,
    grpc.StatusCode.NOT_FOUND: 3,
    grpc.StatusCode.ALREADY_EXISTS: 4,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 4,
    grpc.StatusCode.FAILED_PRECONDITION: 4,
    grpc.StatusCode.UNAUTHENTICATED: 5,
    grpc.StatusCode.PERMISSION_DENIED: 5,
    grpc.StatusCode.UNAVAILABLE: 6,
    grpc.StatusCode.DEADLINE_EXCEEDED: 6,
}


#: ``switch status``: the controller answers, but it does not drive the switch.
SWITCH_UNHEALTHY = 7


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lhc-controller", description="the lhc switch and job controller")
    parser.add_argument(
        "--controller",
        default=DEFAULT_CONTROLLER,
        help="job service of a running controller (default %(default)s, serve's default)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        dest="client_token_file",
        default=os.environ.get(TOKEN_FILE_ENV) or None,
        help=f"the operator's token or a job credential, if the controller needs one (env {TOKEN_FILE_ENV})",
    )
    tls.add_arguments(parser, dest_prefix="client_tls", role={
        "ca": "signed the controller's certificate: with it, the job service is reached over TLS",
        "cert": "shown to the controller when it asks",
        "server_name": "the name in the controller's certificate, when not the --controller host",
    })
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="run the controller"))
    job = sub.add_parser("job", help="create, list, show or delete jobs").add_subparsers(
        dest="action", required=True
    )
    create = job.add_parser("create", help="admit a job")
    create.add_argument("name")
    create.add_argument("--workers", type=int, required=True)
    create.add_argument("--slots", type=int, default=0, help="slots (default 64)")
    create.add_argument("--join-timeout", type=float, default=0.0)
    create.add_argument("--heartbeat-timeout", type=float, default=0.0)
    create.add_argument("--hosts", default="", help="the W workers by name, in rank order: h1,h2,...")
    create.add_argument("--credential-file", type=Path,
                        help="write the job's credential to this file (mode 0600) instead of showing it")
    job.add_parser("list", help="all jobs")
    job.add_parser("show", help="one job, with its members and switch counters").add_argument("name")
    job.add_parser("delete", help="delete a job and free its slots").add_argument("name")
    sub.add_parser("switch", help="the switch connection").add_subparsers(
        dest="action", required=True
    ).add_parser("status", help="connection, primaryship, reconciles")
    return parser


def _state(info: pb.JobInfo) -> str:
    state = pb.JobState.Name(info.state)
    return f"{state} (installed)" if info.installed else state


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _job_rows(jobs: list[pb.JobInfo]) -> str:
    rows = [["NAME", "ID", "STATE", "WORKERS", "SLOTS", "EPOCH"]]
    for j in jobs:
        rows.append(
            [
                j.name,
                str(j.job_id),
                _state(j),
                f"{len(j.members)}/{j.workers}",
                f"{j.slot_base}..{j.slot_base + j.slot_count - 1}",
                str(j.epoch),
            ]
        )
    return _table(rows)


def _show(info: pb.JobInfo) -> str:
    lines = [
        f"job {info.name} (id {info.job_id}): {_state(info)}, epoch {info.epoch}, "
        f"slots {info.slot_base}..{info.slot_base + info.slot_count - 1}, counter row {info.job_index}"
    ]
    if info.failure:
        lines.append(f"failure: {info.failure}")
    fabric = len(info.switches) > 1 or any(m.switch not in ("", "switch") for m in info.members)
    if info.switches and fabric:
        lines.append(f"switches: {', '.join(info.switches)}")
    rows = [["RANK", "NAME", "ADDRESS", "MAC", "PORT", "HEARTBEAT"] + (["SWITCH"] if fabric else [])]
    for m in info.members:
        age = "left" if m.left else f"{m.last_heartbeat_age_s:.1f} s ago"
        rows.append(
            [
                str(m.rank),
                m.name,
                f"{m.address.ip}:{m.address.udp_port}",
                m.address.mac,
                str(m.address.switch_port),
                age,
            ]
            + ([m.switch] if fabric else [])
        )
    lines.append(_table(rows))
    if info.counters:
        nonzero = ", ".join(f"{k.lower()}={v}" for k, v in sorted(info.counters.items()) if v)
        lines.append(f"switch counters: {nonzero or 'all zero'}")
    for per_switch in info.switch_counters if len(info.switch_counters) > 1 else ():
        nonzero = ", ".join(f"{k.lower()}={v}" for k, v in sorted(per_switch.counters.items()) if v)
        lines.append(f"  {per_switch.switch}: {nonzero or 'all zero'}")
    return "\n".join(lines)


def _switch_text(s: pb.SwitchStatusReply) -> str:
    """One switch as before; a fabric as a line for the whole, then a table row per switch."""
    if len(s.switches) <= 1:
        return (
            f"switch {s.address} ({s.target}): {'connected' if s.connected else 'not connected'}, "
            f"{'primary' if s.primary else 'not primary'}, election id {s.election_id}\n"
            f"state: {s.state}\nreconciles {s.reconciles}, updates written {s.updates_written}, "
            f"slots free {s.slots_free}/{s.slots_total}, data plane {s.dataplane}"
            + (f"\nlast error: {s.last_error}" if s.last_error else "")
        )
    rows = [["SWITCH", "ROLE", "P4RUNTIME", "DATA PLANE", "CONNECTED", "PRIMARY", "RECONCILES", "UPDATES",
             "STATE"]]
    for e in s.switches:
        rows.append([e.name, e.role, e.address, e.dataplane, "yes" if e.connected else "no",
                     "yes" if e.primary else "no", str(e.reconciles), str(e.updates_written), e.state])
    errors = [f"{e.name}: {e.last_error}" for e in s.switches if e.last_error]
    return (
        f"{s.state} ({s.target}), election id {s.election_id}, slots free {s.slots_free}/{s.slots_total}\n"
        + _table(rows) + "".join(f"\nlast error of {line}" for line in errors)
    )


def _print(args: argparse.Namespace, message, text: str) -> None:
    if args.json:
        print(
            json_format.MessageToJson(
                message, including_default_value_fields=True, preserving_proto_field_name=True
            )
        )
    else:
        print(text)


def _hand_over(args: argparse.Namespace, info: pb.JobInfo) -> str:
    """The line that shows the new job's credential, once; with --credential-file it goes there instead
    (created 0600, never overwriting a file) and leaves the printed reply."""
    credential = info.job_credential
    if args.credential_file is None:
        return f"job credential (shown once; hand it to the job's workers): {credential}"
    fd = os.open(args.credential_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(credential + "\n")
    info.job_credential = ""
    return f"job credential written to {args.credential_file}"


def run_client(args: argparse.Namespace) -> int:
    token = read_token(args.client_token_file) if args.client_token_file else None
    with JobClient(args.controller, token=token, tls=tls.from_args(args, "client_tls")) as client:
        if args.command == "switch":
            s = client.switch_status()
            _print(args, s, _switch_text(s))
            healthy = all(e.connected and e.primary and "mismatch" not in e.state for e in s.switches or [s])
            return 0 if healthy else SWITCH_UNHEALTHY
        elif args.action == "create":
            info = client.create_job(
                args.name,
                args.workers,
                slots=args.slots,
                join_timeout_s=args.join_timeout,
                heartbeat_timeout_s=args.heartbeat_timeout,
                hosts=[h for h in args.hosts.split(",") if h],
            )
            handed = _hand_over(args, info)
            _print(args, info, f"{_show(info)}\n{handed}")
        elif args.action == "list":
            jobs = client.list_jobs()
            _print(args, pb.ListJobsReply(jobs=jobs), _job_rows(jobs) if jobs else "no jobs")
        elif args.action == "show":
            info = client.status(args.name)
            _print(args, info, _show(info))
        else:
            client.delete_job(args.name)
            _print(args, pb.DeleteJobReply(), f"job {args.name} deleted")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    try:
        return run_client(args)
    except ControllerError as exc:
        print(f"lhc-controller: {pb_code(exc)}: {exc.message}", file=sys.stderr)
        return _EXIT.get(exc.code, 1)
    except (OSError, ValueError) as exc:  # a credential or certificate file (TlsError is a ValueError)
        print(f"lhc-controller: {exc}", file=sys.stderr)
        return 2


def pb_code(exc: ControllerError) -> str:
    return exc.code.name if isinstance(exc.code, grpc.StatusCode) else str(exc.code)


if __name__ == "__main__":
    sys.exit(main())
