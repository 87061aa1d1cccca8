"""``lhc-agent``: join a job and aggregate random or saved tensors through the switch, printing the stats.

    lhc-controller job create try --workers 2            # once
    lhc-agent --job try --length 1000000 --density 0.01   # in two shells (or on two hosts)
    lhc-agent --job try --file gradient.pt --mode sketch

Random inputs come from ``--seed`` and the rank, so running it twice shows the same sums. Each worker
prints one line per call (or JSON with ``--json``); the exit status is 0 when every call succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from host_agent.agent import AGENT_MODES, Agent
from host_agent.errors import AggregationError
from lhc_ina import tls
from lhc_ina.jobservice.client import DEFAULT_CONTROLLER, TOKEN_FILE_ENV, read_token
from lhc_ina.jobservice.errors import ControllerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lhc-agent", description=__doc__.splitlines()[0])
    parser.add_argument("--controller", default=DEFAULT_CONTROLLER, help="job service (%(default)s)")
    parser.add_argument("--job", required=True, help="the job to join")
    parser.add_argument("--ip", default="127.0.0.1", help="this worker's data-plane IPv4 (%(default)s)")
    parser.add_argument("--host", default="", help="join as this topology host instead of --ip")
    parser.add_argument("--token-file", type=Path, default=os.environ.get(TOKEN_FILE_ENV) or None,
                        help=f"the job's credential (from `job create`; env {TOKEN_FILE_ENV})")
    tls.add_arguments(parser, role={
        "ca": "signed the controller's certificate: with it, the job service is reached over TLS",
        "cert": "shown to the controller when it asks",
        "server_name": "the name in the controller's certificate, when not the --controller host",
    })
    parser.add_argument("--mode", choices=AGENT_MODES, default="auto", help="codec mode (%(default)s)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--file", type=Path, help="aggregate this tensor (torch.save'd, any shape)")
    source.add_argument("--length", type=int, default=1 << 20, help="random input length (%(default)s)")
    parser.add_argument("--density", type=float, default=0.01, help="random input density (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random input seed (%(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="calls to make (%(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without progress (%(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object per call")
    return parser


def _input(args: argparse.Namespace, rank: int) -> torch.Tensor:
    if args.file:
        return torch.load(args.file)
    if not 0 < args.density <= 1 or args.length < 1:
        raise SystemExit("lhc-agent: --length must be >= 1 and --density in (0, 1]")
    generator = torch.Generator().manual_seed(args.seed * 1009 + rank)
    x = torch.zeros(args.length)
    hit = torch.randperm(args.length, generator=generator)[: max(1, int(args.length * args.density))]
    x[hit] = torch.randn(hit.numel(), generator=generator)
    return x


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        token = read_token(args.token_file) if args.token_file else None
        config = tls.from_args(args)
    except (OSError, ValueError) as exc:
        print(f"lhc-agent: {exc}", file=sys.stderr)
        return 2
    try:
        agent = Agent.join(args.controller, args.job, mode=args.mode, ip=args.ip, host=args.host, token=token,
                           tls=config, timeout_s=args.timeout)
    except (ControllerError, tls.TlsError) as exc:  # refused (a wrong credential, another job's) or no CA
        print(f"lhc-agent: cannot join {args.job!r}: {exc}", file=sys.stderr)
        return 1
    try:
        tensor = _input(args, agent.rank)
        for call in range(args.repeats):
            stats = agent.allreduce(tensor, key="cli").stats
            shown = {k: v for k, v in stats.items() if k not in ("codec", "transport", "mode_reason")}
            if args.json:
                print(json.dumps({"call": call, "rank": agent.rank, **shown}), flush=True)
            else:
                print(f"rank {agent.rank} call {call}: {stats['mode']}, {stats['bytes_sent'] / 1e6:.3f} MB, "
                      f"{stats['packets']} packets, {stats['retransmissions']} retransmissions, encode "
                      f"{stats['encode_s'] * 1e3:.1f} ms, network {stats['network_s'] * 1e3:.1f} ms, decode "
                      f"{stats['decode_s'] * 1e3:.1f} ms, codec {stats['codec_kernels']} "
                      f"({stats['mode_reason']})", flush=True)
    except AggregationError as error:
        print(f"lhc-agent: {error} (ranks {list(error.ranks)})", file=sys.stderr)
        return 1
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
