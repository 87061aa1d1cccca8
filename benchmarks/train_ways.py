"""The ways ``lhc-bench train`` aggregates gradients, one entry each: what a user would switch on instead
of lhc (plain DDP, torch's PowerSGD hook), the in-network baseline (dense through the switch, as
SwitchML/ATP aggregate) and lhc, exact and (for models with dense gradients) with top-k. A new way is one
more entry here and, where it needs a hook of its own, one branch in ``benchmarks.train_hooks``.

    python -m benchmarks.train_ways MODEL     # the ways a model runs, "NAME HOOK" a line (mininet/run.py)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from host_agent.path_policy import DEFAULT_TRIALS
from lhc_demo.summary import WARMUP_STEPS

#: PowerSGD's configuration, as the issue's users set it: rank 4, its first compressed step the third
#: (torch's default start is step 1000, past any run here); error feedback and warm start on, torch's
#: defaults.
POWERSGD_RANK = 4
POWERSGD_START_ITER = 2
#: top-k's kept fraction of every bucket
TOPK_RATIO = 0.01


@dataclass(frozen=True)
class Way:
    name: str
    label: str
    #: "ddp" (no hook), "powersgd" (torch's hook) or "lhc" (host_agent.torch_hook through the switch)
    hook: str
    #: the lhc hook's codec mode
    mode: str | None = None
    topk_ratio: float | None = None
    #: its losses may differ from DDP's by more than rounding (a compressed, not an exact, sum)
    lossy: bool = False
    #: offered only for models whose gradients are dense
    dense_models_only: bool = False
    #: DDP puts every gradient into one bucket (PowerSGD on Gloo hangs with more: docs/pytorch.md)
    one_bucket: bool = False
    #: the lhc hook's path policy (host_agent.path_policy): "switch", or "fastest" per bucket
    path: str = "switch"
    #: the first steps the summary leaves out of its means (connection set-up, first size estimates and,
    #: for the fastest path, each bucket's warm-up call and its trials of both paths)
    warmup_steps: int = WARMUP_STEPS


WAYS = (
    Way("ddp", "plain DDP (Gloo allreduce)", "ddp"),
    Way("powersgd", f"DDP + PowerSGD hook (rank {POWERSGD_RANK}, lossy)", "powersgd", lossy=True,
        one_bucket=True),
    Way("dense", "dense through the switch (SwitchML/ATP)", "lhc", mode="dense"),
    Way("lhc", "lhc auto (exact)", "lhc", mode="auto"),
    Way("lhc_fastest", "lhc auto, each bucket on its faster path, switch or hosts (exact)", "lhc",
        mode="auto", path="fastest", warmup_steps=1 + 2 * DEFAULT_TRIALS),
    Way("lhc_topk", f"lhc + top-k {TOPK_RATIO:.0%} with error feedback (lossy)", "lhc", mode="auto",
        topk_ratio=TOPK_RATIO, lossy=True, dense_models_only=True),
)
BY_NAME = {way.name: way for way in WAYS}


def ways_for(dense_gradients: bool) -> list[Way]:
    """The ways a model runs: top-k only where its gradients are dense."""
    return [way for way in WAYS if dense_gradients or not way.dense_models_only]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.models import MODELS, build

    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_ways",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    args = parser.parse_args(argv)
    for way in ways_for(build(args.model, "tiny").dense_gradients):
        print(way.name, way.hook)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
