"""One rank of the DDP tests (run as a script by tests/test_torch_hook.py): train a small model with plain
DDP allreduce or with the lhc hook (process group or switch), optionally checkpoint or resume, and save the
parameters and the largest gradient seen.

    python tests/ddp_rank.py RANK WORLD MASTER OUT --hook none|pg|switch|backend [--controller A --job J]
        [--steps N] [--integer] [--save-at K PREFIX] [--resume PREFIX] [--device cpu|cuda]
        [--backend gloo|nccl] [--amp [--overflow-at K]]

``--amp`` trains under autocast with a GradScaler (bfloat16 on CPU, float16 on CUDA) and saves the scale
after every step; ``--overflow-at K`` makes rank 1's loss infinite at step K, as an fp16 overflow would.
``--hook backend`` registers no hook: the process group is the ``lhc`` backend (its job, if any, from
the environment), through which plain DDP's allreduce goes. ``--backend gloo`` keeps DDP's own
collectives on Gloo with CUDA buckets (two ranks on one GPU, which NCCL refuses); the hook's buckets go
through lhc either way. Ranks share the GPUs there are (rank % count).
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from host_agent.torch_hook import LhcHookState, lhc_hook

LR = 2.0**-4


class Tiny(nn.Module):
    """An embedding (sparse rows per step) and a linear layer."""

    def __init__(self, integer: bool) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.embedding = nn.Embedding(512, 8)
        self.linear = nn.Linear(8, 4, bias=False)
        with torch.no_grad():
            for param in self.parameters():
                init = torch.randn(param.shape, generator=generator)
                param.copy_(init.round() if integer else init * 0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(ids))


def batch(rank: int, step: int, integer: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, 512, (6,), generator=generator)
    weights = torch.randint(-3, 4, (6, 4), generator=generator).float()
    return ids, weights if integer else weights * 0.37


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("master")
    parser.add_argument("out")
    parser.add_argument("--hook", choices=["none", "pg", "switch", "backend"], required=True)
    parser.add_argument("--controller")
    parser.add_argument("--job")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--integer", action="store_true")
    parser.add_argument("--save-at", nargs=2)
    parser.add_argument("--resume")
    parser.add_argument("--device", default="cpu", help="cuda runs on NCCL, cpu on Gloo")
    parser.add_argument("--backend", choices=["gloo", "nccl"], help="DDP's process group (default by device)")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--overflow-at", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cuda":
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
    if args.hook == "backend":
        import host_agent.torch_backend  # noqa: F401 - registers "lhc"

        backend = "lhc"
    master = f"tcp://{args.master}"
    dist.init_process_group(backend, init_method=master, rank=args.rank, world_size=args.world)
    model = Tiny(args.integer).to(args.device)
    start = 0
    checkpoint = torch.load(f"{args.resume}.{args.rank}", weights_only=False) if args.resume else None
    if checkpoint:
        model.load_state_dict(checkpoint["model"])
        start = checkpoint["step"]
    ddp = DistributedDataParallel(model)
    state = None
    if args.hook == "pg":
        state = LhcHookState.from_process_group(mode="auto")
    elif args.hook == "switch":
        state = LhcHookState.join(args.controller, args.job, mode="auto")
    if state is not None:
        if checkpoint:
            state.load_state_dict(checkpoint["hook"])
        ddp.register_comm_hook(state, lhc_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    device_type = torch.device(args.device).type
    scaler = torch.amp.GradScaler(device_type, enabled=args.amp)
    half = torch.float16 if device_type == "cuda" else torch.bfloat16
    largest, scales = 0.0, []
    for step in range(start, args.steps):
        if args.save_at and step == int(args.save_at[0]):
            torch.save({"model": model.state_dict(), "step": step,
                        "hook": state.state_dict() if state else None}, f"{args.save_at[1]}.{args.rank}")
        ids, weights = (t.to(args.device) for t in batch(args.rank, step, args.integer))
        with torch.autocast(device_type, dtype=half, enabled=args.amp):
            loss = (ddp(ids) * weights).sum()
        if step == args.overflow_at and args.rank == 1:
            loss = loss * float("inf")
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scale = scaler.get_scale() if args.amp else 1.0
        grads = [float(p.grad.abs().max()) / scale for p in ddp.parameters()]
        if all(map(math.isfinite, grads)):
            largest = max(largest, *grads)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale() if args.amp else 1.0)
    if state is not None:
        state.close()
    params = [p.detach().cpu().clone() for p in model.parameters()]
    aggregated = dict(getattr(dist.group.WORLD, "aggregated", {}))  # the lhc backend's count
    codec = state.agent.last_stats["codec_kernels"] if state is not None and state.agent.last_stats else None
    torch.save({"params": params, "largest_grad": largest, "scales": scales, "lhc": aggregated,
                "codec_kernels": codec}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
