"""One rank of ``lhc-bench train``: models of the paper's four trained with DDP over Gloo, their gradients
aggregated each way asked (``benchmarks.train_ways``), one after the other in the same process group;
writes what it measured as one JSON file (a list, one result per model and way).

    python -m benchmarks.train_worker --rank R --world W --master HOST:PORT --models M[,M] \
        --size tiny|full --ways WAY[,WAY] [--controller HOST:PORT --job-prefix P] --steps N \
        --json-out FILE [--resume-at K]

A way through the switch joins the job ``job_name(P, model, way)``, created beforehand. Every way sees the
same weights and batches (``benchmarks.models``), so the ways differ only in how the gradients are summed.
``--resume-at K`` saves the model, the optimizer and the hook's state before step K and continues from
fresh objects loaded from that checkpoint, as a restarted job would.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from benchmarks.cli import comma_choices
from benchmarks.models import MODELS, build
from benchmarks.models.workload import SIZES, Workload
from benchmarks.train_hooks import BYTES_PER_ELEMENT, WayHook
from benchmarks.train_ways import BY_NAME, Way
from lhc_demo.worker import in_gloo_group

#: The step whose buckets are counted for density: after DDP's bucket rebuild at the end of step 0.
DENSITY_STEP = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's Gloo rendezvous")
    parser.add_argument("--models", type=comma_choices(tuple(MODELS)), required=True, help="comma-separated")
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--ways", type=comma_choices(tuple(BY_NAME)), required=True, help="comma-separated")
    parser.add_argument("--controller", help="the lhc controller's job service (the switch's ways)")
    parser.add_argument("--job-prefix", default="train", help="the switch's jobs' names: see job_name")
    parser.add_argument("--ip", default="127.0.0.1", help="this worker's data-plane IPv4 (%(default)s)")
    parser.add_argument("--host", default="", help="join as this topology host (Mininet runs)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume-at", type=int, default=None, metavar="K",
                        help="checkpoint before step K and continue from fresh objects loaded from it")
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument("--progress", action="store_true", help="print one line per finished step")
    return parser


def job_name(prefix: str, model: str, way: str) -> str:
    """The controller's job for ``model`` trained ``way`` (every rank of it joins)."""
    return f"{prefix}-{model}-{way}"


def ddp_options(way: Way, workload: Workload) -> dict:
    """One bucket for the whole gradient where the way needs it; DDP's default buckets otherwise (an
    explicit cap also applies to DDP's first bucket, which is otherwise 1 MiB)."""
    if not way.one_bucket:
        return {}
    return {"bucket_cap_mb": workload.parameters() * BYTES_PER_ELEMENT / 2**20 + 1}


class Trainer:
    """The DDP model, its optimizer and the way's hook; ``resume`` rebuilds all three from a checkpoint."""

    def __init__(self, args: argparse.Namespace, model: str, way: str) -> None:
        self.args, self.name = args, model
        self.workload = build(model, args.size, args.seed)
        self.way = BY_NAME[way]
        self.hook = WayHook(self.way, args.world, controller=args.controller,
                            job=job_name(args.job_prefix, model, way), ip=args.ip, host=args.host)
        self._wrap(self.workload.module)

    def _wrap(self, module: torch.nn.Module) -> None:
        self.model = DistributedDataParallel(module, **ddp_options(self.way, self.workload))
        self.hook.attach(self.model)
        self.optimizer = self.workload.optimizer(self.model)

    def resume(self, batch: tuple[torch.Tensor, ...]) -> None:
        """Save everything that decides the next steps, then continue from fresh objects loaded from it.

        A hook's state that is one flat tensor per bucket (PowerSGD's error feedback and warm-started
        matrices, top-k's residuals) holds only in the bucket layout it was saved in: DDP lays a new
        model's buckets out in reverse registration order and, after its first backward, again in the
        order the gradients came. So the fresh model takes one backward of ``batch`` with the hook passing
        buckets through untouched (DDP then rebuilds its layout at the next forward) before the hook's
        state and the checkpoint's weights are loaded; without it the states above land on the wrong
        elements once after a restart."""
        buffer = io.BytesIO()
        torch.save({"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "hook": self.hook.state_dict()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=False)
        module = build(self.name, self.args.size, self.args.seed + 1).module  # other weights...
        module.load_state_dict(saved["model"])  # ...replaced by the checkpoint's
        self._wrap(module)
        self.hook.passing_through(True)
        self.workload.loss(self.model, batch).backward()
        self.hook.passing_through(False)
        module.load_state_dict(saved["model"])  # the layout's backward moved batch norm's statistics
        self.hook.restore(saved["hook"])
        self.optimizer.load_state_dict(saved["optimizer"])

    def step(self, batch: tuple[torch.Tensor, ...]) -> float:
        loss = self.workload.loss(self.model, batch)
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def resident_mb() -> float | None:
    """This process's resident memory now (MB), where /proc says it; None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_s() -> float:
    """CPU seconds this process has used, all its threads, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def train(args: argparse.Namespace, model: str, way: str) -> dict:
    """Train ``model`` ``args.steps`` steps ``way``: every rank's per-step losses, this rank's times, bytes
    and densities."""
    trainer = Trainer(args, model, way)
    parameters = trainer.workload.parameters()
    losses, step_s, step_cpu_s, costs, resident = [], [], [], [], []
    for step in range(args.steps):
        batch = trainer.workload.batch(args.rank, step)
        if step == args.resume_at:
            trainer.resume(batch)
        trainer.hook.measure(step == min(DENSITY_STEP, args.steps - 1))
        started, cpu_started = time.perf_counter(), cpu_s()
        losses.append(trainer.step(batch))
        step_s.append(time.perf_counter() - started)
        step_cpu_s.append(cpu_s() - cpu_started)
        costs.append(trainer.hook.pop_step(parameters))
        resident.append(resident_mb())
        if args.progress:
            print(f"step {model} {way} {step} loss {losses[-1]:.6f} {step_s[-1]:.3f}s", flush=True)
    every_rank: list[list[float]] = [[] for _ in range(args.world)]
    dist.all_gather_object(every_rank, losses)
    trainer.hook.close()
    return {
        "way": way, "rank": args.rank, "world": args.world, "model": model, "size": args.size,
        "config": trainer.workload.config, "parameters": parameters, "losses": every_rank,
        "step_s": step_s, "cpu_s": step_cpu_s, "bytes_per_step": [cost["bytes"] for cost in costs],
        "bytes_basis": costs[-1]["bytes_basis"] if costs else "",
        "modes": sorted({mode for cost in costs for mode in cost.get("modes", ())}),
        "aggregate_s": [cost.get("network_s", 0.0) for cost in costs],
        "codec_s": [[cost.get("encode_s", 0.0), cost.get("decode_s", 0.0)] for cost in costs],
        "buckets_by_path": [cost.get("buckets_by_path", [0, 0]) for cost in costs],  # [switch, host]
        # the process group's long sums per step: words packed, words plain, packed bytes sent
        "long_sum_words": [cost.get("long_sum_words") for cost in costs],  # None for a way without lhc
        "resident_mb": resident,
        "density": {str(index): list(counts) for index, counts in trainer.hook.density().items()},
        "settled_paths": trainer.hook.settled_paths(),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    torch.set_num_threads(1)

    def every_way() -> list[dict]:
        results = []
        for model in args.models:
            for way in args.ways:
                results.append(train(args, model, way))
                gc.collect()  # the way's model, optimizer and hook (DDP's hook state holds cycles) go now
                dist.barrier()  # every rank done before the next way starts
        return results

    args.json_out.write_text(json.dumps(in_gloo_group(args.master, args.rank, args.world, every_way)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
