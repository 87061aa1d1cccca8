"""``mininet/run.py --model M``: one of the paper's four models (``benchmarks/models``) trained every way
``lhc-bench train`` trains it, inside the emulated hosts, one way after another.

Runs under the system Python like run.py; the project's code runs in the hosts' processes under the
project's interpreter (``args.python``), which also says which ways the model has and sums them up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

#: ``benchmarks.train_worker.job_name``'s prefix: the job of (model, way) is train-MODEL-WAY
JOB_PREFIX = "train"


def plan(args: argparse.Namespace, env: dict[str, str], cwd: Path) -> list[tuple[str, bool]]:
    """The model's ways in order (those of ``--ways``), each with whether it goes through the switch
    (``benchmarks.train_ways``)."""
    done = subprocess.run([args.python, "-m", "benchmarks.train_ways", args.model], capture_output=True,
                          text=True, check=True, cwd=cwd, env=env)
    ways = [(name, hook == "lhc") for name, hook in (line.split() for line in done.stdout.splitlines())]
    wanted = args.ways.split(",") if args.ways else [name for name, _ in ways]
    unknown = sorted(set(wanted) - {name for name, _ in ways})
    if unknown:
        raise SystemExit(f"--ways: {args.model} has no way {', '.join(unknown)} (it has "
                         f"{', '.join(name for name, _ in ways)})")
    return [(name, through_switch) for name, through_switch in ways if name in wanted]


def job(args: argparse.Namespace, way: str) -> str:
    return f"{JOB_PREFIX}-{args.model}-{way}"


def worker_argv(args: argparse.Namespace, way: str, rank: int, master: str, out: Path, ip: str, host: str,
                controller: str) -> list[str]:
    return [args.python, "-m", "benchmarks.train_worker", "--rank", str(rank), "--world", str(args.workers),
            "--master", master, "--models", args.model, "--size", args.size, "--ways", way,
            "--steps", str(args.steps), "--json-out", str(out), "--ip", ip, "--host", host,
            "--controller", controller, "--job-prefix", JOB_PREFIX]


def summarize(args: argparse.Namespace, runs: dict, extra: dict, env: dict[str, str], cwd: Path) -> dict:
    """``benchmarks.train_summary`` of the ways' results, with the emulation's settings; also appended to
    ``args.out/models.jsonl``, from which ``benchmarks.train_summary --plot`` draws the figure."""
    args.out.mkdir(parents=True, exist_ok=True)
    runs_file = args.out / f"runs-{args.model}-{args.bw:g}.json"
    runs_file.write_text(json.dumps(runs))
    done = subprocess.run([args.python, "-m", "benchmarks.train_summary", str(runs_file)], check=True,
                          capture_output=True, text=True, cwd=cwd, env=env)
    result = {**json.loads(done.stdout), **extra, "bw_mbit": args.bw}
    with (args.out / "models.jsonl").open("a") as rows:
        rows.write(json.dumps(result) + "\n")
    return result
