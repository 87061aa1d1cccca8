"""What the training demo reports: the three runs side by side, one JSON summary line and a plot.

    python -m lhc_demo.summary RUNS.json [--plot FILE.png]    # runs gathered elsewhere (Mininet)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks import figures

#: One color per run in every panel.
COLORS = {"ddp": "tab:blue", "dense": "tab:orange", "lhc": "tab:green"}
#: A run's first steps include connection set-up and the codec's first-round size estimates.
WARMUP_STEPS = 2


def mean_losses(run: dict) -> list[float]:
    """Per step, the mean of the ranks' losses."""
    return [statistics.fmean(step) for step in zip(*run["losses"], strict=True)]


def steady_mean(values: list[float], warmup: int = WARMUP_STEPS) -> float:
    """The mean after the ``warmup`` steps (all of them when the run is shorter than that)."""
    tail = values[warmup:] or values
    return statistics.fmean(tail) if tail else 0.0


def step_time(ranks: list[dict], warmup: int = WARMUP_STEPS) -> float:
    """A step lasts as long as its slowest rank."""
    per_step = [max(step) for step in zip(*(r["step_s"] for r in ranks), strict=True)]
    return steady_mean(per_step, warmup)


def bytes_per_step(ranks: list[dict], warmup: int = WARMUP_STEPS) -> float:
    """Bytes one worker put on the wire per step (rank 0's; every rank sends the same amount)."""
    return steady_mean([float(b) for b in ranks[0]["bytes_per_step"]], warmup)


def host_steps(ranks: list[dict]) -> list[int]:
    """The steps in which any rank sent a bucket over the hosts instead of the switch."""
    flags = [r.get("host_steps", []) for r in ranks]
    return [step for step, on_hosts in enumerate(zip(*flags, strict=True)) if any(on_hosts)]


def summarize(runs: dict[str, list[dict]]) -> dict:
    """The demo's JSON summary from the ranks' results of the ``ddp``, ``dense`` and ``lhc`` runs."""
    ddp, dense, lhc = (runs[name] for name in ("ddp", "dense", "lhc"))
    lhc_losses, dense_losses, ddp_losses = (mean_losses(r[0]) for r in (lhc, dense, ddp))
    times = {name: step_time(ranks) for name, ranks in runs.items()}
    lhc_bytes, dense_bytes = bytes_per_step(lhc), bytes_per_step(dense)
    return {
        "losses_match": all(a["losses"] == b["losses"] for a, b in zip(lhc, dense, strict=True)),
        "aucs_match": lhc[0]["auc"] == dense[0]["auc"],
        "max_loss_diff_vs_ddp": max(abs(a - b) for a, b in zip(lhc_losses, ddp_losses, strict=True)),
        "bytes_ratio": dense_bytes / lhc_bytes if lhc_bytes else float("inf"),
        "step_speedup_vs_dense": times["dense"] / times["lhc"],
        "step_speedup_vs_ddp": times["ddp"] / times["lhc"],
        "step_s": times,
        "bytes_per_step": {"dense": dense_bytes, "lhc": lhc_bytes},
        "aggregate_s": {name: steady_mean(runs[name][0]["aggregate_s"]) for name in ("dense", "lhc")},
        # packets sent again over the whole run, all ranks: found from the results, by a timer, by a probe;
        # and the packets of the whole run (first sends), all ranks
        "retransmissions": {name: {kind: sum(r["retransmissions"][kind] for r in runs[name])
                                   for kind in ("fast", "timer", "probe")} for name in ("dense", "lhc")},
        "packets": {name: sum(r["packets"] for r in runs[name]) for name in ("dense", "lhc")},
        "final_loss": {"ddp": ddp_losses[-1], "dense": dense_losses[-1], "lhc": lhc_losses[-1]},
        # held-out ROC AUC (0.5 is chance): of the untrained model (the same in every run), after the
        # first step and after the last
        "initial_auc": ddp[0]["initial_auc"],
        "first_auc": {name: ranks[0]["auc"][0] for name, ranks in runs.items()},
        "last_auc": {name: ranks[0]["auc"][-1] for name, ranks in runs.items()},
        # steps in which the lhc run sent a bucket over the hosts (its switch path failed: --kill-switch-at),
        # and its path changes (host_agent.paths)
        "lhc_host_steps": host_steps(lhc),
        "lhc_path_changes": lhc[0].get("path_changes", {"fallbacks": 0, "returns": 0}),
        "workers": lhc[0]["world"],
        "steps": len(lhc_losses),
    }


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    """Loss curves, held-out AUC, bytes per step and step times of the three runs, in one PNG."""
    plt = figures.pyplot()
    figure, ((losses, auc), (wire, times)) = plt.subplots(2, 2, figsize=(12, 8))
    for name, ranks in runs.items():
        color = COLORS.get(name)
        losses.plot(mean_losses(ranks[0]), label=name, color=color)
        # x = steps done: the untrained model at 0, after step s at s + 1
        auc.plot([ranks[0]["initial_auc"], *ranks[0]["auc"]], label=name, color=color)
        per_step = [max(step) for step in zip(*(r["step_s"] for r in ranks), strict=True)]
        times.plot(per_step, label=name, color=color)
        if ranks[0]["bytes_per_step"]:
            wire.plot([b / 1e6 for b in ranks[0]["bytes_per_step"]], label=name, color=color)
    for step in host_steps(runs["lhc"]):  # the lhc run's steps over the hosts, shaded in every panel by step
        for panel in (losses, wire, times):
            panel.axvspan(step - 0.5, step + 0.5, color=COLORS["lhc"], alpha=0.15, linewidth=0,
                          label="lhc over the hosts" if step == host_steps(runs["lhc"])[0] else None)
    losses.set(title="training loss (mean over workers)", xlabel="step", ylabel="BCE loss")
    auc.axhline(0.5, color="grey", linestyle="--", label="chance")
    auc.set(title="held-out ROC AUC", xlabel="steps done", ylabel="AUC")
    wire.set(title="bytes on the wire per worker and step", xlabel="step", ylabel="MB")
    times.set(title="step time (slowest worker)", xlabel="step", ylabel="seconds")
    figures.save(figure, path, legends=(losses, auc, wire, times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lhc_demo.summary", description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help='JSON: {"ddp": [rank results], "dense": [...], "lhc": [...]}')
    parser.add_argument("--plot", type=Path, help="also draw the runs into this PNG")
    args = parser.parse_args(argv)
    runs = json.loads(args.runs.read_text())
    if args.plot:
        plot(runs, args.plot)
    print(json.dumps(summarize(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
