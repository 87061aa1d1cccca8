"""`make demo`: data-parallel training through the switch, three ways on the same data and seed.

1. ``ddp``: plain DDP allreduce over Gloo (what people run today);
2. ``dense``: every gradient bucket through the switch uncompressed (the SwitchML/ATP baseline);
3. ``lhc``: the lhc DDP hook through the switch (lossless homomorphic compression, mode ``auto``).

The switch is softswitch on UDP over loopback, admitted jobs come from the controller; the demo starts
and stops both, so nothing needs root or a P4 toolchain. It prints the per-step losses, held-out AUCs and
costs, writes a plot and the ranks' raw results to ``--out``, and ends with one JSON summary line
(``lhc_demo.summary``).

    python -m lhc_demo.train [--workers 4] [--steps 20] [--out build/demo] [--json] [model options]
                             [--kill-switch-at STEP [--restart-switch-after SECONDS]]

``--kill-switch-at`` kills the switch (-9) in the middle of the lhc run (the last of the three): the ranks
go on over the process group with the same bits, so its losses still equal the dense run's, and the plot
shades the steps that went over the hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from lhc_demo import summary
from lhc_demo.worker import RUNS, config_arguments
from lhc_ina.jobservice.errors import ControllerError
from lhc_launch.processes import ControllerProcess, SoftswitchProcess

#: A worker that has not finished by then is stuck: the demo fails instead of hanging.
RUN_TIMEOUT_S = 900
#: Slots per job, the most packets a worker keeps in flight: 64 (the controller's default, sized for a
#: switch shared by many jobs) caps a loopback worker at 64 packets per round trip; the demo has the
#: switch to itself.
DEMO_SLOTS = 256
#: With --kill-switch-at, how long a packet waits before the ranks leave the switch (30 s by default).
FAULT_SWITCH_TIMEOUT_S = 3.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lhc_demo.train", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (%(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (%(default)s)")
    parser.add_argument("--out", type=Path, default=Path("build/demo"), help="plot and results (%(default)s)")
    parser.add_argument("--json", action="store_true", help="print only the JSON summary line")
    parser.add_argument("--kill-switch-at", type=int, metavar="STEP",
                        help="in the lhc run, kill the switch (-9) once step STEP is done: the ranks go on "
                             "over the hosts with the same bits (docs/pytorch.md)")
    parser.add_argument("--restart-switch-after", type=float, metavar="SECONDS",
                        help="with --kill-switch-at: start the switch again this long after the kill; the "
                             "ranks return to it at a step end")
    config_arguments(parser)
    return parser


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_argv(args: argparse.Namespace, run: str, rank: int, master: str, job: str | None,
                 controller: str, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "lhc_demo.worker", "--rank", str(rank), "--world", str(args.workers),
            "--master", master, "--run", run, "--steps", str(args.steps), "--json-out", str(out),
            "--users", str(args.users), "--items", str(args.items), "--dim", str(args.dim),
            "--batch", str(args.batch), "--seed", str(args.seed)]
    if job:
        argv += ["--controller", controller, "--job", job]
    if rank == 0:
        argv.append("--progress")
    if args.kill_switch_at is not None:
        argv += ["--switch-timeout", str(FAULT_SWITCH_TIMEOUT_S)]
    return argv


class SwitchFault:
    """``--kill-switch-at``: kills the switch when rank 0 reports that step done (in the lhc run), and
    with ``--restart-switch-after`` starts it again that much later, on its own thread."""

    def __init__(self, switch: SoftswitchProcess, args: argparse.Namespace) -> None:
        self.switch, self.at, self.after = switch, args.kill_switch_at, args.restart_switch_after
        self.thread: threading.Thread | None = None

    def step_done(self, run: str, line: str) -> None:
        if run != "lhc" or self.at is None or self.thread is not None or line.split()[1] != str(self.at):
            return
        self.switch.kill()
        if self.after is not None:
            self.thread = threading.Thread(target=self._restart, daemon=True)
            self.thread.start()

    def _restart(self) -> None:
        time.sleep(self.after)
        self.switch.restart(crash=True)


def run_workers(argvs: list[list[str]], outs: list[Path], *, steps: int, desc: str, quiet: bool,
                timeout_s: float = RUN_TIMEOUT_S, on_step: Callable[[str], None] | None = None) -> list[dict]:
    """Start one worker process per argv (rank 0 prints a line per step: the progress bar, and ``on_step``
    hears each such line), wait for all,
    and return their JSON results in rank order; a failed worker raises with the tail of its stderr (kept
    in a file beside its result, so that a chatty worker never blocks on a full pipe)."""
    logs = [out.with_suffix(".log") for out in outs]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                         stderr=logs[rank].open("w"), text=True)
        for rank, argv in enumerate(argvs)
    ]
    try:
        with tqdm(total=steps, desc=desc, unit="step", disable=quiet, leave=False) as bar:
            for line in procs[0].stdout:
                if line.startswith("step "):
                    bar.update(1)
                    if on_step is not None:
                        on_step(line)
        codes = [proc.wait(timeout=timeout_s) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    failed = [rank for rank, code in enumerate(codes) if code != 0]
    if failed:
        tail = logs[failed[0]].read_text().strip().splitlines()[-15:]
        raise RuntimeError(f"{desc}: worker(s) {failed} failed (exit codes {codes}); rank "
                           f"{failed[0]} said:\n" + "\n".join(tail))
    return [json.loads(out.read_text()) for out in outs]


def run_once(args: argparse.Namespace, run: str, controller: ControllerProcess, scratch: Path,
             fault: SwitchFault | None = None) -> list[dict]:
    """One run: W worker processes, their JSON results in rank order."""
    job = None
    if run != "ddp":
        job = f"demo-{run}"
        controller.client.create_job(job, workers=args.workers, slots=DEMO_SLOTS)
    master = f"127.0.0.1:{free_port()}"
    outs = [scratch / f"{run}-{rank}.json" for rank in range(args.workers)]
    argvs = [_worker_argv(args, run, rank, master, job, controller.listen, outs[rank])
             for rank in range(args.workers)]
    try:
        on_step = None if fault is None else lambda line: fault.step_done(run, line)
        return run_workers(argvs, outs, steps=args.steps, desc=f"run {run}", quiet=args.json, on_step=on_step)
    finally:
        if job:  # the job ends when its last worker leaves; after a failure it is deleted here
            with contextlib.suppress(ControllerError):
                controller.client.delete_job(job)


def _print_table(runs: dict[str, list[dict]]) -> None:
    losses = {name: summary.mean_losses(ranks[0]) for name, ranks in runs.items()}
    print(f"{'step':>4} " + " ".join(f"{name + ' loss':>14}" for name in runs)
          + " " + " ".join(f"{name + ' auc':>9}" for name in runs)
          + f" {'dense MB':>9} {'lhc MB':>8} " + " ".join(f"{name + ' s':>8}" for name in runs))
    for step in range(len(losses["lhc"])):
        row = f"{step:>4} " + " ".join(f"{losses[name][step]:>14.8f}" for name in runs)
        row += " " + " ".join(f"{ranks[0]['auc'][step]:>9.4f}" for ranks in runs.values())
        row += f" {runs['dense'][0]['bytes_per_step'][step] / 1e6:>9.3f}"
        row += f" {runs['lhc'][0]['bytes_per_step'][step] / 1e6:>8.3f} "
        row += " ".join(f"{max(r['step_s'][step] for r in runs[name]):>8.3f}" for name in runs)
        print(row)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 2 <= args.workers <= 32:
        raise SystemExit("--workers must be in 2..32")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if args.kill_switch_at is not None and not 0 <= args.kill_switch_at < args.steps - 1:
        raise SystemExit("--kill-switch-at must name a step before the last")
    if args.restart_switch_after is not None and args.kill_switch_at is None:
        raise SystemExit("--restart-switch-after needs --kill-switch-at")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lhc-demo-") as tmp:
        scratch = Path(tmp)
        with SoftswitchProcess() as switch, ControllerProcess(switch, scratch / "controller") as controller:
            fault = SwitchFault(switch, args)
            runs = {run: run_once(args, run, controller, scratch, fault) for run in RUNS}
            if fault.thread is not None:
                fault.thread.join()
    (args.out / "runs.json").write_text(json.dumps(runs))
    result = summary.summarize(runs)
    summary.plot(runs, args.out / "demo.png")
    if not args.json:
        _print_table(runs)
        print(f"plot: {args.out / 'demo.png'}")
    print(json.dumps(result))
    return 0 if result["losses_match"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
