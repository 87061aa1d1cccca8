"""Run the PTF suite against a target: ``python -m ptf_tests.run --target softswitch|bmv2 [TEST ...]``.

``--pipeline native|python`` picks softswitch's pipeline (its own default when left out).

As root: create the veth pairs, start the target on their switch ends, run ``ptf`` on their other ends
with the test parameters the base class reads, and tear everything down whatever happens (failure,
Ctrl-C, SIGTERM). The exit status is ptf's (2 for a harness error before ptf ran).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lhc_ina.p4info import V1MODEL_P4INFO
from ptf_tests import targets, veth

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_DIR = REPO_ROOT / "ptf_tests"
#: Negative checks ("nothing else arrives") wait this long; BMv2 is slower to forward than softswitch.
NEGATIVE_TIMEOUT = {"softswitch": 0.1, "bmv2": 0.3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ptf_tests.run", description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=["softswitch", "bmv2"], default="softswitch")
    parser.add_argument("--pipeline", choices=["native", "python"], default=None,
                        help="softswitch's pipeline (default: softswitch's own, native where it is built)")
    parser.add_argument("--ports", type=int, default=8, help="veth pairs = PTF ports 1..N (default 8)")
    parser.add_argument("--p4info", type=Path, default=V1MODEL_P4INFO)
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="default build/ptf/<target>, or build/ptf/softswitch-<pipeline>")
    parser.add_argument("--log-level", default="INFO", help="softswitch's --log-level (DEBUG, INFO, ...)")
    parser.add_argument("--negative-timeout", type=float, default=None, help="seconds; default per target")
    parser.add_argument("--failfast", action="store_true")
    parser.add_argument("tests", nargs="*", help="ptf test specs (module or module.Class); default all")
    args = parser.parse_args(argv)
    if args.pipeline and args.target != "softswitch":
        parser.error("--pipeline applies to softswitch only")
    return args


def ptf_command(
    args: argparse.Namespace, pairs: list[veth.VethPair], target: targets.Target, log_dir: Path
) -> list[str]:
    params = {
        "grpc_addr": target.grpc_addr,
        "device_id": 1,
        "p4info": str(args.p4info),
        "device_config": str(target.device_config or ""),
    }
    negative = args.negative_timeout or NEGATIVE_TIMEOUT[args.target]
    command = [
        str(Path(sys.executable).parent / "ptf"),
        "--test-dir",
        str(TEST_DIR),
        "--pypath",
        str(REPO_ROOT),
        "--log-dir",
        str(log_dir),
        "--default-timeout",
        "3",
        "--default-negative-timeout",
        str(negative),
        "--test-params",
        ";".join(f"{key}={value!r}" for key, value in params.items()),
    ]
    if args.failfast:
        command.append("--failfast")
    for pair in pairs:
        command += ["--interface", f"{pair.port}@{pair.ptf_end}"]
    return command + args.tests


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks below tear down the veths and the target."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("ptf_tests.run needs root (veth pairs, AF_PACKET)", file=sys.stderr)
        return 2
    name = f"{args.target}-{args.pipeline}" if args.pipeline else args.target
    log_dir = args.log_dir or REPO_ROOT / "build" / "ptf" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminate)
    pairs = veth.pair_names(range(1, args.ports + 1))
    target = None
    try:
        veth.create(pairs)
        target = targets.start(args.target, pairs, log_dir, log_level=args.log_level, pipeline=args.pipeline)
        command = ptf_command(args, pairs, target, log_dir)
        started = time.monotonic()
        status = subprocess.run(command, cwd=REPO_ROOT).returncode
        print(f"ptf on {args.target}: exit {status} in {time.monotonic() - started:.1f} s; logs in {log_dir}")
        if target.process.poll() is not None:
            print(f"{args.target} exited during the run ({target.process.returncode}); see {target.log_path}")
            status = status or 1
        return status
    except targets.TargetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if target is not None:
            target.stop()
        veth.delete(pairs)


if __name__ == "__main__":
    sys.exit(main())
