"""`lhc-bench aggregate`: lhc against dense aggregation through the same switch and against Gloo's
allreduce, in the same run.

Starts softswitch (UDP on loopback) and the controller, or uses ``--controller ADDR``; for each density
it admits a job and runs W worker processes (``benchmarks.aggregate_worker``) that aggregate one sparse
float32 bucket in every mode of ``--modes``, checking each result exactly, and then allreduce the same
buckets, dense, in a Gloo process group of the same processes (TCP on loopback; mode ``gloo``, checked
within float rounding: ``benchmarks.aggregate_gloo``), and aggregate them with the codec's dense mode over
that process group (mode ``hosts``, exact: the path a dense bucket takes with ``path="fastest"``). One
JSON object per (density, mode):
``elements_per_s`` counts dense-equivalent elements aggregated per second (the bucket's length over the
slowest worker's time); ``speedup_vs_dense`` and ``speedup_vs_gloo`` divide dense's and Gloo's times by
the mode's. ``max_error`` is the largest difference from the row's ``reference``; ``within_tolerance``
says it is at most ``tolerance`` (0 for the switch's modes, which must be ``exact``).

With ``--loss P`` the agents' sockets drop datagrams with probability P both ways (counted: ``dropped``)
in a second pass of the same run, each datagram on its own; with ``--loss-burst B`` as well, a third pass
loses them in runs of B (the loss rate still P), as an interface or a queue drops a UDP GSO send whole.
Every row says its loss model (``loss``, ``loss_burst``); the lossy rows carry ``time_vs_lossless`` (the
mode's time over its lossless time) and the retransmissions by kind (``fast_retransmissions`` found from
the results, ``timer_retransmissions`` by a timer). ``--engine`` picks the agents' packet engine.

``--topology leafspine`` runs every lhc mode once more, in the same run, over ``--leaves`` L leaves and a
spine (``lhc_launch.processes.FabricProcesses``: L + 1 softswitch processes on loopback, W/L workers under
each leaf, one controller driving them all); those rows carry ``topology: leafspine`` and
``seconds_vs_single_switch``: their time over the same mode's through one switch at the same loss, with W
workers there, or, for W above the 32 one switch holds (up to 1024 over 32 leaves), with 32 workers
scaled per worker (times W / 32).

``--per-process K`` runs K workers in each worker process (each an agent with its own socket, on its own
thread; default 1 up to 32 workers, 8 beyond): 64 worker processes each with its own interpreter and copy
of every input do not fit two cores. Gloo's and the hosts' rows need one process per worker, so they are
left out when K > 1 (``speedup_vs_gloo`` is then null).
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

from benchmarks import figures
from benchmarks.aggregate_gloo import worst
from lhc_ina.constants import MAX_JOB_WORKERS, MAX_LEAVES, MAX_WORKERS

MODES = ("dense", "sketch", "union", "auto")
#: The rows every run has: the baselines of the speedups.
BASELINES = ("dense", "gloo")
#: The rows over the hosts' process group, beside the switch's modes: Gloo's allreduce and the codec's
#: dense mode (``benchmarks.aggregate_gloo``).
PROCESS_GROUP_ROWS = ("gloo", "hosts")


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


def _probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"a loss probability lies in [0, 1), got {text}")
    return value


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
    parser.add_argument("--workers", type=_bounded(2, MAX_JOB_WORKERS), default=8,
                        help="W (default %(default)s; above 32 with --topology leafspine only)")
    parser.add_argument("--modes", type=_modes, default=["dense", "sketch", "auto"],
                        help="comma-separated modes; dense is always run (default dense,sketch,auto)")
    parser.add_argument("--repeats", type=_bounded(1, 100), default=2,
                        help="timed calls per mode, the fastest counts (default %(default)s)")
    parser.add_argument("--loss", type=_probability, default=0.0,
                        help="datagram loss probability at every agent's socket, both ways (default 0); the "
                             "same run measures every mode without loss too, and the lossy rows give "
                             "time_vs_lossless")
    parser.add_argument("--loss-burst", type=_bounded(1, 1024), default=1, metavar="B",
                        help="with --loss: also a pass that loses datagrams in runs of up to B within one "
                             "send or receive batch (the loss rate still --loss), as an interface drops a "
                             "UDP GSO send whole (default 1: per datagram only)")
    parser.add_argument("--engine", choices=("native", "python"),
                        help="the agents' packet engine (default: native where it is built)")
    parser.add_argument("--python-path", action="store_true",
                        help="also run mode auto through a softswitch on its Python pipeline with agents on "
                             "the Python engine (row auto-python-path; the auto row gains "
                             "speedup_vs_python_path)")
    parser.add_argument("--topology", choices=("single", "leafspine"), default="single",
                        help="leafspine: also run every lhc mode over two leaves of W/2 workers and a spine "
                             "(rows gain seconds_vs_single_switch; default %(default)s)")
    parser.add_argument("--leaves", type=_bounded(2, MAX_LEAVES), default=2,
                        help="leaves of --topology leafspine, W/L workers under each (default %(default)s)")
    parser.add_argument("--per-process", type=_bounded(0, 64), default=0, metavar="K",
                        help="workers per worker process (default 0: 1 up to 32 workers, 8 beyond)")
    parser.add_argument("--controller", help="use this running controller instead of starting one")
    parser.add_argument("--json", action="store_true", help="JSON lines only (no progress bar)")
    parser.add_argument("--plot", type=Path, help="write speedup against density to this PNG")


def per_process(args: argparse.Namespace) -> int:
    """Workers per worker process (``--per-process``, or its default)."""
    return args.per_process or (1 if args.workers <= MAX_WORKERS else 8)


def single_workers(args: argparse.Namespace) -> int:
    """Workers of the one-switch passes: W, or the 32 one switch holds."""
    return min(args.workers, MAX_WORKERS)


def _processes(workers: int, per: int, ips: list[str] | None) -> list[tuple[int, list[str]]]:
    """(agents, its --ip arguments) per worker process: ``per`` agents each, a process's agents under one
    leaf (``ips``: each worker's address, a fabric places a worker by its host's)."""
    addresses = ips or [""] * workers
    groups: dict[str, int] = {}
    for ip in addresses:
        groups[ip] = groups.get(ip, 0) + 1
    out = []
    for ip, count in groups.items():
        for first in range(0, count, per):
            out.append((min(per, count - first), ["--ip", ip] if ip else []))
    return out


def _run_pass(args: argparse.Namespace, controller: str, client: Any, density: float, index: int,
              scratch: Path, loss: float, modes: list[str] | None = None, engine: str | None = None,
              gloo: bool = True, burst: int = 1, ips: list[str] | None = None) -> list[dict]:
    """One job through every mode at ``loss`` (in runs of ``burst``): W workers over a fabric (``ips``:
    each worker's address), else ``single_workers``; the Gloo row too in a lossless pass of one worker per
    process."""
    workers = len(ips) if ips else single_workers(args)
    job = f"bench-{index}-{density}-{loss}-{burst}-{engine}-{workers}"
    client.create_job(job, workers=workers)
    argv = [sys.executable, "-m", "benchmarks.aggregate_worker", "--controller", controller, "--job", job,
            "--length", str(args.length), "--density", str(density), "--workers", str(workers),
            "--modes", ",".join(modes or args.modes), "--repeats", str(args.repeats), "--seed", str(index),
            "--loss", str(loss), "--loss-burst", str(burst)]
    if engine or args.engine:
        argv += ["--engine", engine or args.engine]
    per = per_process(args)
    if loss == 0 and gloo and per == 1:
        # Gloo's rendezvous through a file no other run uses: no port to pick; its data still goes over TCP
        argv += ["--gloo-init", (scratch / f"gloo-{index}").as_uri()]
    procs = [subprocess.Popen([*argv, "--agents", str(agents), *where], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for agents, where in _processes(workers, per, ips)]
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
            tails = "\n".join(err[-3000:] for _, err in outputs)
            raise RuntimeError(f"a worker failed at density {density}; the workers' errors:\n{tails}")
    return [json.loads(line) for out, _ in outputs for line in out.splitlines() if line.startswith("{")]


def _run_density(args: argparse.Namespace, controller: str, client: Any, density: float, index: int,
                 scratch: Path) -> list[dict]:
    """The lossless pass (with Gloo), and with ``--loss`` the lossy ones (per datagram, and in runs of
    ``--loss-burst``), summarized against it."""
    lossless = _summarize(args, density, _run_pass(args, controller, client, density, index, scratch, 0.0),
                          0.0, None)
    if not args.loss:
        return lossless
    gloo_s = next((row["seconds"] for row in lossless if row["mode"] == "gloo"), None)
    clean = {row["mode"]: row["seconds"] for row in lossless}
    lossy = []
    for burst in sorted({1, args.loss_burst}):
        rows = _run_pass(args, controller, client, density, index, scratch, args.loss, burst=burst)
        for row in _summarize(args, density, rows, args.loss, gloo_s, burst=burst):
            row["time_vs_lossless"] = row["seconds"] / clean[row["mode"]]
            lossy.append(row)
    return lossless + lossy


def _python_path_rows(args: argparse.Namespace, density: float, index: int, scratch: Path,
                      results: list[dict]) -> list[dict]:
    """Mode auto once more, through a softswitch running its Python pipeline with agents on the Python
    engine (the packet path before it went native), in the same run; the native auto row gains
    ``speedup_vs_python_path``."""
    from lhc_launch.processes import ControllerProcess, SoftswitchProcess

    with SoftswitchProcess(pipeline="python") as switch, \
            ControllerProcess(switch, scratch / f"python-path-{index}") as controller:
        rows = _run_pass(args, controller.listen, controller.client, density, index, scratch, 0.0,
                         modes=["auto"], engine="python", gloo=False)
    dense = next(r for r in results if r["mode"] == "dense" and r["density"] == density and r["loss"] == 0)
    gloo = next(r for r in results if r["mode"] == "gloo" and r["density"] == density)
    args_auto = argparse.Namespace(**{**vars(args), "modes": ["auto"]})
    (row,) = _summarize(args_auto, density, rows, 0.0, gloo["seconds"], dense["seconds"])
    row.update(mode="auto-python-path", pipeline="python", engine="python")
    native = next(r for r in results if r["mode"] == "auto" and r["density"] == density and r["loss"] == 0)
    native["speedup_vs_python_path"] = row["seconds"] / native["seconds"]
    return [row]


def _leafspine_rows(args: argparse.Namespace, fabric: Any, controller: Any, density: float, index: int,
                    scratch: Path, single: list[dict]) -> list[dict]:
    """Every lhc mode over the leaf/spine fabric (W/L workers under each leaf), at each loss of the
    single-switch rows (and loss model), each row against the same mode's time through one switch, scaled
    per worker where one switch ran fewer (``single_workers``)."""
    ips = [fabric.host_ips[rank * len(fabric.host_ips) // args.workers] for rank in range(args.workers)]
    per_worker = args.workers / single_workers(args)
    rows = []
    for loss, burst in sorted({(row["loss"], row["loss_burst"]) for row in single}):
        baseline = {row["mode"]: row for row in single if (row["loss"], row["loss_burst"]) == (loss, burst)}
        passed = _run_pass(args, controller.listen, controller.client, density, index, scratch, loss,
                           gloo=False, burst=burst, ips=ips)
        gloo_s = next((r["seconds"] for r in single if r["mode"] == "gloo"), None)  # the lossless pass's
        for row in _summarize(args, density, passed, loss, gloo_s, burst=burst):
            single_s = baseline[row["mode"]]["seconds"]
            row.update(topology="leafspine", leaves=len(fabric.host_ips),
                       single_switch_workers=single_workers(args),
                       seconds_vs_single_switch=row["seconds"] / (single_s * per_worker))
            rows.append(row)
    return rows


def _largest(ranks: list[dict], key: str) -> float | None:
    """The largest of the ranks' ``key``; None where the row does not measure it (Gloo's bytes)."""
    values = [r.get(key) for r in ranks]
    return None if None in values else max(values)


def _summed(ranks: list[dict], key: str) -> int | None:
    """The ranks' ``key`` summed; None where the row does not count it (Gloo's retransmissions)."""
    values = [r.get(key) for r in ranks]
    return None if None in values else sum(values)


def _summarize(args: argparse.Namespace, density: float, rows: list[dict], loss: float,
               gloo_s: float | None, dense_s: float | None = None, burst: int = 1) -> list[dict]:
    """One row per mode; ``gloo_s`` and ``dense_s``: the baselines' times where this pass has no such
    row (a lossy pass has no Gloo, the Python path's pass only auto)."""
    by_mode: dict[str, list[dict]] = {}
    for row in rows:
        by_mode.setdefault(row["mode"], []).append(row)
    if dense_s is None:
        dense_s = max(r["seconds"] for r in by_mode["dense"])
    if gloo_s is None and "gloo" in by_mode:
        gloo_s = max(r["seconds"] for r in by_mode["gloo"])
    results = []
    for mode in [m for m in [*args.modes, *PROCESS_GROUP_ROWS] if m in by_mode]:
        ranks = by_mode[mode]
        seconds = max(r["seconds"] for r in ranks)
        results.append({
            "mode": mode, "chosen": sorted({r["chosen"] for r in ranks}), "length": args.length,
            "density": density, "workers": len(ranks), "per_process": per_process(args), "seconds": seconds,
            "elements_per_s": args.length / seconds, "dense_elements_per_s": args.length / dense_s,
            "gloo_elements_per_s": None if gloo_s is None else args.length / gloo_s,
            "speedup_vs_dense": dense_s / seconds,
            "speedup_vs_gloo": None if gloo_s is None else gloo_s / seconds,
            "bytes_per_worker": _largest(ranks, "bytes_per_worker"),
            "retransmissions": _summed(ranks, "retransmissions"),
            "fast_retransmissions": _summed(ranks, "fast_retransmissions"),
            "timer_retransmissions": _summed(ranks, "timer_retransmissions"),
            "tail_probes": _summed(ranks, "tail_probes"),
            "rtt_s": _largest(ranks, "rtt_s"), "rto_s": _largest(ranks, "rto_s"),
            "packets": _summed(ranks, "packets"), "dropped": _summed(ranks, "dropped"),
            "encode_s": _largest(ranks, "encode_s"), "network_s": _largest(ranks, "network_s"),
            "decode_s": _largest(ranks, "decode_s"), "loss": loss, "loss_burst": burst,
            "engine": args.engine or "default",
            "reference": ranks[0]["reference"], "exact": all(r["exact"] for r in ranks),
            "max_error": worst([r["max_error"] for r in ranks]), "tolerance": ranks[0]["tolerance"],
            # NaN compares false: a NaN anywhere fails the check
            "within_tolerance": all(r["max_error"] <= r["tolerance"] for r in ranks),
        })
    return results


def _plot(results: list[dict], path: Path) -> None:
    """Speedup against density, over dense through the switch (left) and over Gloo (right)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = figures.pyplot()

    # a mode's color, the same in both panels
    colors = {mode: f"C{i}" for i, mode in enumerate([*MODES, *PROCESS_GROUP_ROWS])}
    figure, panels = plt.subplots(1, 2, figsize=(11, 4))
    clean = [r for r in results if r["loss"] == 0 and r["mode"] in colors]
    for axes, baseline in zip(panels, BASELINES, strict=True):
        for mode in sorted({r["mode"] for r in clean} - {baseline}):
            points = sorted((r["density"], r[f"speedup_vs_{baseline}"]) for r in clean
                            if r["mode"] == mode and r[f"speedup_vs_{baseline}"] is not None)
            if not points:  # no Gloo row in this run (several workers per process)
                continue
            style = "--" if mode in BASELINES else "-"  # the other baseline
            axes.plot(*zip(*points, strict=True), marker="o", linestyle=style, color=colors[mode], label=mode)
        axes.axhline(1.0, color=colors[baseline], linestyle=":", label=baseline)
        # log speedups: Gloo and the switch's modes lie orders of magnitude apart on a Python switch
        axes.set(xscale="log", yscale="log", xlabel="density per worker", ylabel=f"speedup over {baseline}",
                 title=f"over {baseline}, W={results[0]['workers']}, {results[0]['length']:,} elements")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(NullFormatter())
    figures.save(figure, path, legends=panels)


def _check(args: argparse.Namespace) -> str | None:
    """What in ``args`` no run can do, or None."""
    if args.workers > MAX_WORKERS and args.topology != "leafspine":
        return (f"--workers {args.workers}: one switch holds {MAX_WORKERS} workers of a job (one bitmap bit "
                "each); more need --topology leafspine")
    if args.topology == "leafspine" and -(-args.workers // args.leaves) > MAX_WORKERS:
        return f"--workers {args.workers} over --leaves {args.leaves}: a leaf holds {MAX_WORKERS} workers"
    if args.topology == "leafspine" and args.workers < args.leaves:
        return f"--workers {args.workers} cannot fill --leaves {args.leaves}"
    if args.python_path and per_process(args) != 1:
        return "--python-path compares against Gloo's row: it needs one worker per process"
    return None


def run(args: argparse.Namespace) -> int:
    from lhc_ina.jobservice.client import JobClient
    from lhc_launch.processes import ControllerProcess, FabricProcesses, SoftswitchProcess

    problem = _check(args)
    if problem:
        print(f"lhc-bench aggregate: {problem}", file=sys.stderr)
        return 2

    results: list[dict] = []
    fabric = fabric_controller = None
    with contextlib.ExitStack() as stack:
        if args.controller:
            address, client = args.controller, stack.enter_context(JobClient(args.controller))
        else:
            switch = stack.enter_context(SoftswitchProcess())
            state = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lhc-bench-")))
            controller = stack.enter_context(ControllerProcess(switch, state))
            address, client = controller.listen, controller.client
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lhc-bench-gloo-")))
        if args.topology == "leafspine":
            fabric_state = scratch / "fabric"
            fabric = stack.enter_context(FabricProcesses(args.leaves, fabric_state))
            fabric_controller = stack.enter_context(ControllerProcess(fabric, fabric_state))
            fabric_controller.wait_for_switch()
        for index, density in enumerate(tqdm(args.density, desc="densities", disable=args.json)):
            rows = _run_density(args, address, client, density, index, scratch)
            if args.python_path:
                rows += _python_path_rows(args, density, index, scratch, rows)
            if fabric is not None:
                for row in rows:
                    row.setdefault("topology", "single")
                rows += _leafspine_rows(args, fabric, fabric_controller, density, index, scratch, rows)
            for row in rows:
                results.append(row)
                print(json.dumps(row), flush=True)
    if args.plot:
        _plot(results, args.plot)
    return 0 if all(r["within_tolerance"] for r in results) else 1
