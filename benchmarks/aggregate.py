"""`lhc-bench aggregate`: lhc against dense aggregation through the same switch, in the same run.

Starts softswitch (UDP on loopback) and the controller, or uses ``--controller ADDR``; for each density
it admits a job and runs W worker processes (``benchmarks.aggregate_worker``) that aggregate one sparse
float32 bucket in every mode of ``--modes``, checking each result exactly. One JSON object per (density,
mode): ``elements_per_s`` counts dense-equivalent elements aggregated per second (the bucket's length over
the slowest worker's time), and ``speedup_vs_dense`` divides dense's time by the mode's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

MODES = ("dense", "sketch", "union", "auto")


def _densities(text: str) -> list[float]:
    values = [float(v) for v in text.split(",")]
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"densities must lie in (0, 1], got {text}")
    return values


def _modes(text: str) -> list[str]:
    modes = text.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    return ["dense", *[m for m in modes if m != "dense"]]  # dense is the baseline of every speedup


def _bounded(low: int, high: int):
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--length", type=_bounded(64, 1 << 28), default=1 << 22,
                        help="elements per bucket (default %(default)s)")
    parser.add_argument("--density", type=_densities, default=[0.01],
                        help="comma-separated nonzero fractions per worker (default 0.01)")
    parser.add_argument("--workers", type=_bounded(2, 32), default=8, help="W (default %(default)s)")
    parser.add_argument("--modes", type=_modes, default=["dense", "sketch", "auto"],
                        help="comma-separated modes; dense is always run (default dense,sketch,auto)")
    parser.add_argument("--repeats", type=_bounded(1, 100), default=2,
                        help="timed calls per mode, the fastest counts (default %(default)s)")
    parser.add_argument("--loss", type=float, default=0.0,
                        help="datagram loss probability at every agent's socket, both ways (default 0)")
    parser.add_argument("--controller", help="use this running controller instead of starting one")
    parser.add_argument("--json", action="store_true", help="JSON lines only (no progress bar)")
    parser.add_argument("--plot", type=Path, help="write speedup against density to this PNG")


def _run_density(args: argparse.Namespace, controller: str, client: Any, density: float, index: int
                 ) -> list[dict]:
    job = f"bench-{index}-{density}"
    client.create_job(job, workers=args.workers)
    argv = [sys.executable, "-m", "benchmarks.aggregate_worker", "--controller", controller, "--job", job,
            "--length", str(args.length), "--density", str(density), "--workers", str(args.workers),
            "--modes", ",".join(args.modes), "--repeats", str(args.repeats), "--seed", str(index),
            "--loss", str(args.loss)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(args.workers)]
    try:
        outputs = [proc.communicate(timeout=1800) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        with contextlib.suppress(Exception):
            client.delete_job(job)
    for proc, (_, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"a worker failed at density {density}:\n{err[-3000:]}")
    rows = [json.loads(line) for out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    return _summarize(args, density, rows)


def _summarize(args: argparse.Namespace, density: float, rows: list[dict]) -> list[dict]:
    by_mode: dict[str, list[dict]] = {}
    for row in rows:
        by_mode.setdefault(row["mode"], []).append(row)
    dense_s = max(r["seconds"] for r in by_mode["dense"])
    results = []
    for mode in args.modes:
        ranks = by_mode[mode]
        seconds = max(r["seconds"] for r in ranks)
        results.append({
            "mode": mode, "chosen": sorted({r["chosen"] for r in ranks}), "length": args.length,
            "density": density, "workers": args.workers, "seconds": seconds,
            "elements_per_s": args.length / seconds, "dense_elements_per_s": args.length / dense_s,
            "speedup_vs_dense": dense_s / seconds,
            "bytes_per_worker": max(r["bytes_per_worker"] for r in ranks),
            "retransmissions": sum(r["retransmissions"] for r in ranks),
            "encode_s": max(r["encode_s"] for r in ranks), "network_s": max(r["network_s"] for r in ranks),
            "decode_s": max(r["decode_s"] for r in ranks), "loss": args.loss,
            "exact": all(r["exact"] for r in ranks),
        })
    return results


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for mode in sorted({r["mode"] for r in results} - {"dense"}):
        points = sorted((r["density"], r["speedup_vs_dense"]) for r in results if r["mode"] == mode)
        axes.plot(*zip(*points, strict=True), marker="o", label=mode)
    axes.axhline(1.0, color="grey", linestyle="--", label="dense")
    axes.set(xscale="log", xlabel="density per worker", ylabel="speedup over dense",
             title=f"aggregation through softswitch, W={results[0]['workers']}")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    from controller.processes import ControllerProcess, SoftswitchProcess
    from lhc_ina.jobservice.client import JobClient

    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        if args.controller:
            address, client = args.controller, stack.enter_context(JobClient(args.controller))
        else:
            switch = stack.enter_context(SoftswitchProcess())
            state = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lhc-bench-")))
            controller = stack.enter_context(ControllerProcess(switch, state))
            address, client = controller.listen, controller.client
        for index, density in enumerate(tqdm(args.density, desc="densities", disable=args.json)):
            for row in _run_density(args, address, client, density, index):
                results.append(row)
                print(json.dumps(row), flush=True)
    if args.plot:
        _plot(results, args.plot)
    return 0 if all(r["exact"] for r in results) else 1
