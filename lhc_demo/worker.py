"""One rank of the training demo: DDP over Gloo, its gradients aggregated by plain allreduce or by the
lhc hook through the switch. Writes what it measured as one JSON file.

    python -m lhc_demo.worker --rank R --world W --master HOST:PORT --run ddp|dense|lhc \
        [--controller HOST:PORT --job NAME] --steps N --json-out FILE [model options]

The demo (``lhc_demo.train``) and the Mininet runner start one per rank. Every run sees the same batches
(``lhc_demo.recsys``), so the runs differ only in how gradients are aggregated.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lhc_demo.metrics import roc_auc
from lhc_demo.recsys import DemoConfig, Recommender, SyntheticClicks, make_optimizer

T = TypeVar("T")
RUNS = ("ddp", "dense", "lhc")
#: The hook's codec mode per run: dense aggregation through the switch is the SwitchML/ATP baseline.
HOOK_MODES = {"dense": "dense", "lhc": "auto"}


def config_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and data options, shared with the demo's own command line."""
    defaults = DemoConfig()
    parser.add_argument("--users", type=int, default=defaults.users, help="user embedding rows (%(default)s)")
    parser.add_argument("--items", type=int, default=defaults.items, help="item embedding rows (%(default)s)")
    parser.add_argument("--dim", type=int, default=defaults.dim, help="embedding width (%(default)s)")
    parser.add_argument("--batch", type=int, default=defaults.batch,
                        help="samples per worker and step; sets the density (%(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="model and data seed (%(default)s)")


def config_from(args: argparse.Namespace) -> DemoConfig:
    return DemoConfig(users=args.users, items=args.items, dim=args.dim, batch=args.batch, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lhc_demo.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's Gloo rendezvous")
    parser.add_argument("--run", choices=RUNS, required=True)
    parser.add_argument("--controller", help="the lhc controller's job service (dense and lhc runs)")
    parser.add_argument("--job", help="the job name created on the controller (dense and lhc runs)")
    parser.add_argument("--ip", default="127.0.0.1", help="this worker's data-plane IPv4 (%(default)s)")
    parser.add_argument("--host", default="", help="join as this topology host (Mininet runs)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument("--progress", action="store_true", help="print one line per finished step")
    parser.add_argument("--switch-timeout", type=float, default=30.0,
                        help="seconds a packet may wait before the switch path is left (%(default)s)")
    config_arguments(parser)
    return parser


def _attach_hook(model: DistributedDataParallel, args: argparse.Namespace):
    """Register the lhc hook on ``model``, its agent joined to the job; returns the hook state."""
    from host_agent.torch_hook import LhcHookState, lhc_hook

    if not (args.controller and args.job):
        raise SystemExit(f"--run {args.run} aggregates through the switch: give --controller and --job")
    state = LhcHookState.join(
        args.controller, args.job, mode=HOOK_MODES[args.run], ip=args.ip, host=args.host,
        timeout_s=args.switch_timeout,
    )
    model.register_comm_hook(state, lhc_hook)
    return state


def _held_out_auc(model: Recommender, held_out: tuple[torch.Tensor, ...]) -> float:
    """The model's ROC AUC on the held-out set. Every rank computes it, outside the timed step: the
    replicas are equal, and a rank evaluating alone would make the others wait in the next allreduce."""
    users, items, clicked = held_out
    with torch.no_grad():
        return roc_auc(model(users, items), clicked)


def train(args: argparse.Namespace) -> dict:
    """Train ``args.steps`` steps; the per-step losses of every rank, this rank's times and its held-out
    AUC before training and after every step."""
    torch.set_num_threads(1)
    config = config_from(args)
    data = SyntheticClicks(config)
    held_out = data.held_out()
    model = DistributedDataParallel(Recommender(config))
    state = _attach_hook(model, args) if args.run != "ddp" else None
    optimizer = make_optimizer(model.module, config)
    initial_auc = _held_out_auc(model.module, held_out)
    losses, step_s, wire_bytes, aggregate_s, auc = [], [], [], [], []
    retransmitted = {"fast": 0, "timer": 0, "probe": 0}
    packets, host_steps = 0, []
    for step in range(args.steps):
        users, items, clicked = data.batch(args.rank, step)
        started = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(model(users, items), clicked)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        step_s.append(time.perf_counter() - started)
        losses.append(loss.item())
        auc.append(_held_out_auc(model.module, held_out))
        if args.progress:
            print(f"step {step} loss {losses[-1]:.6f} auc {auc[-1]:.4f} {step_s[-1]:.3f}s", flush=True)
        if state is not None:
            step_stats = state.pop_step_stats()
            wire_bytes.append(step_stats["bytes_sent"])
            aggregate_s.append(step_stats["network_s"])
            retransmitted["fast"] += int(step_stats["fast_retransmissions"])
            retransmitted["timer"] += int(step_stats["timer_retransmissions"])
            retransmitted["probe"] += int(step_stats["tail_probes"])
            packets += int(step_stats["packets"])
            host_steps.append(int(step_stats["buckets_host"]) > 0)  # a bucket went over the hosts
    every_rank: list[list[float]] = [[] for _ in range(args.world)]
    dist.all_gather_object(every_rank, losses)
    backend = state.agent.backend if state is not None else None  # a PathBackend counts its changes
    path_changes = {name: getattr(backend, name, 0) for name in ("fallbacks", "returns")}
    if state is not None:
        state.close()
    return {
        "run": args.run,
        "rank": args.rank,
        "world": args.world,
        "losses": every_rank,
        "step_s": step_s,
        "bytes_per_step": wire_bytes,
        "aggregate_s": aggregate_s,
        "retransmissions": retransmitted,
        "packets": packets,
        "host_steps": host_steps,
        "path_changes": path_changes,
        "initial_auc": initial_auc,
        "auc": auc,
        "config": config.to_dict(),
    }


def in_gloo_group(master: str, rank: int, world: int, work: Callable[[], T]) -> T:
    """``work()`` as rank ``rank`` of a Gloo group of ``world`` whose rendezvous is ``master``
    (HOST:PORT), torn down after every rank is done."""
    host, _, port = master.rpartition(":")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the Mininet runner names the host's interface
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world)
    try:
        result = work()
        # Every rank done before any tears the group down: rank 0 also serves the rendezvous store, and
        # once (a clean-clone `make test`) it aborted at the end of the plain DDP run with "terminate
        # called without an active exception", the other rank still leaving.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = in_gloo_group(args.master, args.rank, args.world, lambda: train(args))
    args.json_out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
