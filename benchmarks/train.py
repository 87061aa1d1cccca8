"""`lhc-bench train --model M`: one of the paper's four models trained every way, side by side, in one run.

Starts softswitch (UDP on loopback) and the controller, then for each way (``benchmarks.train_ways``:
plain DDP over Gloo, DDP with torch's PowerSGD hook, dense through the switch, lhc ``auto``, and for
models with dense gradients lhc with top-k) runs W worker processes (``benchmarks.train_worker``) on the
same weights and batches, and prints one JSON object (``benchmarks.train_summary``): per way the slowest
worker's step time, speedups against DDP and PowerSGD, bytes per worker and step, gradient density, the
final loss and its difference from DDP's, and whether lhc's losses equal dense-through-the-switch's bit
for bit (``lhc_losses_equal_dense``; null when the ways run include no dense way to compare with). The
exit status is 1 when they do not.

    lhc-bench train --model ncf|lstm|vgg19|bert [--size tiny|full] [--workers 4] [--steps 6] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.models import MODELS, build, check
from benchmarks.models.workload import SIZES
from benchmarks.train_summary import summarize
from benchmarks.train_ways import BY_NAME, ways_for
from benchmarks.train_worker import job_name
from lhc_demo.train import DEMO_SLOTS, free_port, run_workers
from lhc_ina.jobservice.errors import ControllerError
from lhc_launch.processes import ControllerProcess, SoftswitchProcess

#: the switch's jobs are JOB_PREFIX-MODEL-WAY
JOB_PREFIX = "train"
#: Every job is created before the workers start, and they run the ways in turn: a later way's job waits
#: for the earlier ways (BERT-base's first two took more than the controller's default 120 s).
JOIN_TIMEOUT_S = 4 * 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--size", choices=SIZES, default="full",
                        help="small: BERT only, BERT-mini's layers (%(default)s)")
    parser.add_argument("--tiny", action="store_const", const="tiny", dest="size", help="--size tiny")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (%(default)s)")
    parser.add_argument("--steps", type=int, default=6,
                        help="steps per way; the first 2 are warm-up, left out of the times (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="weights and data (%(default)s)")
    parser.add_argument("--ways", help="a comma-separated subset of the model's ways (default: all)")
    parser.add_argument("--resume-at", type=int, default=None, metavar="K",
                        help="every worker checkpoints before step K and continues from the checkpoint")
    parser.add_argument("--out", type=Path, help="also write the ranks' raw results here (JSON)")
    parser.add_argument("--json", action="store_true", help="print only the JSON (no progress bars)")


def worker_argv(args: argparse.Namespace, models: list[str], ways: list[str], rank: int, master: str,
                out: Path, controller: str) -> list[str]:
    """The command line of one rank, which trains every model every way in turn."""
    argv = [sys.executable, "-m", "benchmarks.train_worker", "--rank", str(rank), "--world",
            str(args.workers), "--master", master, "--models", ",".join(models), "--size", args.size,
            "--ways", ",".join(ways), "--steps", str(args.steps), "--seed", str(args.seed),
            "--json-out", str(out), "--controller", controller, "--job-prefix", JOB_PREFIX]
    if args.resume_at is not None:
        argv += ["--resume-at", str(args.resume_at)]
    if rank == 0:
        argv.append("--progress")
    return argv


def chosen_ways(args: argparse.Namespace) -> list[str]:
    offered = [way.name for way in ways_for(build(args.model, "tiny").dense_gradients)]
    if not args.ways:
        return offered
    asked = args.ways.split(",")
    unknown = [name for name in asked if name not in offered]
    if unknown:
        raise SystemExit(f"--ways: {unknown} not among {args.model}'s ways {offered}")
    return asked


def run_ways(args: argparse.Namespace, models: list[str], ways: list[str], controller: ControllerProcess,
             scratch: Path) -> dict[str, dict[str, list[dict]]]:
    """``args.workers`` worker processes that train every model every way in turn (``args``: this
    command's options, ``--model`` aside); per model and way, its ranks' results in rank order."""
    scratch.mkdir(parents=True, exist_ok=True)
    jobs = [job_name(JOB_PREFIX, model, way) for model in models for way in ways
            if BY_NAME[way].hook == "lhc"]
    for job in jobs:
        controller.client.create_job(job, workers=args.workers, slots=DEMO_SLOTS,
                                     join_timeout_s=JOIN_TIMEOUT_S)
    master = f"127.0.0.1:{free_port()}"
    outs = [scratch / f"rank{rank}.json" for rank in range(args.workers)]
    argvs = [worker_argv(args, models, ways, rank, master, outs[rank], controller.listen)
             for rank in range(args.workers)]
    try:
        ranks = run_workers(argvs, outs, steps=args.steps * len(models) * len(ways), desc=",".join(models),
                            quiet=args.json)
    finally:
        for job in jobs:  # a job ends when its last worker leaves; after a failure it is deleted here
            with contextlib.suppress(ControllerError):
                controller.client.delete_job(job)
    # the workers' order: every way of a model, model by model
    return {model: {way: [results[m * len(ways) + w] for results in ranks] for w, way in enumerate(ways)}
            for m, model in enumerate(models)}


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.workers <= 32:
        raise SystemExit("--workers must be in 2..32")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    try:
        check(args.model, args.size)
    except ValueError as error:
        raise SystemExit(f"--size: {error}") from None
    ways = chosen_ways(args)
    with tempfile.TemporaryDirectory(prefix="lhc-train-") as tmp:
        scratch = Path(tmp)
        with SoftswitchProcess() as switch, ControllerProcess(switch, scratch / "controller") as controller:
            runs = run_ways(args, [args.model], ways, controller, scratch)[args.model]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(runs))
    result = summarize(runs)
    print(json.dumps(result, indent=None if args.json else 1))
    return 1 if result["lhc_losses_equal_dense"] is False else 0
