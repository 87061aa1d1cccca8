"""What ``lhc-bench train`` and the emulation report: per way, from its ranks' results, the step time of
the slowest worker, speedups against DDP and PowerSGD, bytes, gradient density and losses; and the plot
of speedup against link rate, one panel per model.

    python -m benchmarks.train_summary RUNS.json                  # {way: [rank results]} -> JSON
    python -m benchmarks.train_summary --plot FIG.png ROWS.jsonl  # summaries (one a line) -> the figure
    python -m benchmarks.train_summary --bars FIG.png ROWS.jsonl  # step times at one link rate, as bars
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks import figures
from benchmarks.models import MODELS
from benchmarks.train_ways import BY_NAME
from host_agent.long_sum import packing_from_environment
from lhc_demo.summary import WARMUP_STEPS, bytes_per_step, mean_losses, steady_mean, step_time

#: The ways whose losses must equal dense-through-the-switch's bit for bit (exact sums of one quantization).
EXACT_THROUGH_SWITCH = ("lhc", "lhc_fastest")
COLORS = {"ddp": "tab:blue", "powersgd": "tab:purple", "dense": "tab:orange", "lhc": "tab:green",
          "lhc_topk": "tab:olive", "lhc_fastest": "tab:red"}


def density(ranks: list[dict]) -> dict | None:
    """Rank 0's measured density: over the whole gradient and per DDP bucket (None where not measured)."""
    buckets = ranks[0]["density"]
    if not buckets:
        return None
    nonzero = sum(counts[0] for counts in buckets.values())
    total = sum(counts[1] for counts in buckets.values())
    return {"overall": nonzero / total,
            "per_bucket": {index: counts[0] / counts[1]
                           for index, counts in sorted(buckets.items(), key=lambda kv: int(kv[0]))},
            "bucket_elements": {index: counts[1] for index, counts in buckets.items()}}


def speedup(runs: dict[str, list[dict]], baseline: str, name: str) -> float | None:
    """``baseline``'s step time over ``name``'s, both timed over the same steps: from the later of their
    warm-ups (a way timed from step 5 against DDP timed from step 2 would meet steps that drift on a
    shared machine at other times). None where ``baseline`` did not run."""
    if baseline not in runs:
        return None
    common = max(BY_NAME[baseline].warmup_steps, BY_NAME[name].warmup_steps)
    return step_time(runs[baseline], common) / step_time(runs[name], common)


def summarize(runs: dict[str, list[dict]]) -> dict:
    """The JSON of one model's run: a row per way, the model's layout, and whether lhc equals dense."""
    first = next(iter(runs.values()))[0]
    times = {name: step_time(ranks, BY_NAME[name].warmup_steps) for name, ranks in runs.items()}
    losses = {name: mean_losses(ranks[0]) for name, ranks in runs.items()}
    measured = {name: density(ranks) for name, ranks in runs.items()}
    model_density = measured.get("lhc") or next((d for d in measured.values() if d), None)
    rows = []
    for name, ranks in runs.items():
        way = BY_NAME[name]
        row = {
            "way": name, "label": way.label, "lossy": way.lossy,
            "step_s": times[name],
            # each over the steps both ways timed (``speedup``)
            "speedup_vs_ddp": speedup(runs, "ddp", name),
            "speedup_vs_powersgd": speedup(runs, "powersgd", name),
            "bytes_per_worker_step": bytes_per_step(ranks, way.warmup_steps),
            "bytes_basis": ranks[0]["bytes_basis"], "timed_from_step": way.warmup_steps,
            "gradient_density": (measured[name] or model_density or {}).get("overall"),
            "gradient_density_from": name if measured[name] else "lhc (the same model's buckets)",
            "final_loss": losses[name][-1],
            "loss_diff_vs_ddp": losses[name][-1] - losses["ddp"][-1] if "ddp" in losses else None,
            "max_loss_diff_vs_ddp": (max(abs(a - b) for a, b in zip(losses[name], losses["ddp"], strict=True))
                                     if "ddp" in losses else None),
        }
        if all("cpu_s" in rank for rank in ranks):  # CPU seconds per step, all threads, the ranks' mean
            steps = zip(*(rank["cpu_s"] for rank in ranks), strict=True)
            row["cpu_s_per_worker_step"] = steady_mean([sum(s) / len(s) for s in steps], way.warmup_steps)
        resident = [mb for rank in ranks for mb in rank.get("resident_mb", ()) if mb is not None]
        row["peak_resident_mb_per_worker"] = max(resident) if resident else None
        if ranks[0]["modes"]:
            row["lhc_modes"] = ranks[0]["modes"]
            row["aggregate_s"] = steady_mean(ranks[0]["aggregate_s"], way.warmup_steps)
        if name in EXACT_THROUGH_SWITCH and "dense" in runs:
            row["losses_equal_dense"] = all(a["losses"] == b["losses"]
                                            for a, b in zip(ranks, runs["dense"], strict=True))
        rows.append(row)
    compared = [row for row in rows if "losses_equal_dense" in row]
    return {
        "model": first["model"], "size": first["size"], "parameters": first["parameters"],
        "config": first["config"], "workers": first["world"], "steps": len(first["step_s"]),
        # steady_mean's: the steps after the warm-up (each row's timed_from_step), all in a shorter run
        "timed_steps": len(first["step_s"][WARMUP_STEPS:] or first["step_s"]),
        "gradient_density": model_density,
        # None where no exact lhc way ran beside dense: nothing was compared
        "lhc_losses_equal_dense": (all(row["losses_equal_dense"] for row in compared) if compared else None),
        "ways": rows,
        # how the process-group codec's long sums went (LHC_PACKING, read by every worker alike)
        "lhc_packing": packing_from_environment(),
        "loadavg_1min_at_end": os.getloadavg()[0],
    }


def _rate_label(bw_mbit: float) -> str:
    if not bw_mbit:
        return "unshaped"
    return f"{bw_mbit / 1000:g} Gbit/s" if bw_mbit >= 1000 else f"{bw_mbit:g} Mbit/s"


def plot(summaries: list[dict], path: Path) -> None:
    """Speedup over DDP against link rate: one panel per model, one line per way (``bw_mbit`` 0 is
    unshaped, drawn rightmost)."""
    plt = figures.pyplot()
    present = {s["model"] for s in summaries}
    models = [name for name in MODELS if name in present]
    # one x position per link rate of any panel, unshaped rightmost
    rates = sorted({s.get("bw_mbit") or 0.0 for s in summaries}, key=lambda bw: bw or float("inf"))
    labels = [_rate_label(bw) for bw in rates]
    figure, panels = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for axes, model in zip(panels[0], models, strict=True):
        runs = [s for s in summaries if s["model"] == model]
        for way in BY_NAME:
            points = sorted((rates.index(s.get("bw_mbit") or 0.0), row["speedup_vs_ddp"]) for s in runs
                            for row in s["ways"] if row["way"] == way)
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", color=COLORS[way],
                          label=way + (" (lossy)" if BY_NAME[way].lossy else ""))
        axes.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        axes.set_xticks(range(len(labels)), labels)
        axes.set_yscale("log")
        size = runs[0]["size"] if runs else ""
        axes.set(title=f"{model} ({size})", xlabel="link rate", ylabel="step speedup over DDP")
    figures.save(figure, path, legends=panels[0])


def plot_steps(summaries: list[dict], path: Path) -> None:
    """Step time of the slowest worker per way, a group of bars per run (model, size and, where it was
    not ``measured``, the long sums' packing), each lhc bar labelled with its speedup over DDP: for runs
    at one link rate, where a line against the rate would be a single point."""
    plt = figures.pyplot()
    figure, axes = plt.subplots(figsize=(2.2 + 1.6 * len(summaries), 3.8))
    ways = [way for way in BY_NAME if any(row["way"] == way for s in summaries for row in s["ways"])]
    width = 0.8 / len(ways)
    for group, summary in enumerate(summaries):
        for slot, way in enumerate(ways):
            row = next((row for row in summary["ways"] if row["way"] == way), None)
            if row is None:
                continue
            x = group + (slot - (len(ways) - 1) / 2) * width
            axes.bar(x, row["step_s"], width, color=COLORS[way], label=way if group == 0 else None)
            if way != "ddp" and row["speedup_vs_ddp"]:
                axes.annotate(f"{row['speedup_vs_ddp']:.2f}x", (x, row["step_s"]), ha="center", va="bottom",
                              fontsize=8)
    names = [f"{s['model']} ({s['size']})" + ("" if s.get("lhc_packing", "measured") == "measured"
                                              else f"\npacking {s['lhc_packing']}") for s in summaries]
    axes.set_xticks(range(len(summaries)), names)
    axes.set_yscale("log")
    rate = {_rate_label(s.get("bw_mbit") or 0.0) for s in summaries}
    axes.set(ylabel="step time of the slowest worker (s)", title=f"step time at {', '.join(sorted(rate))}")
    figures.save(figure, path, legends=[axes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_summary",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="{way: [rank results]} JSON, or with --plot summaries JSONL")
    parser.add_argument("--plot", type=Path, help="draw INPUT's summaries (one a line) into this PNG")
    parser.add_argument("--bars", type=Path, help="INPUT's summaries' step times as bars, into this PNG")
    args = parser.parse_args(argv)
    if args.plot or args.bars:
        summaries = [json.loads(line) for line in args.input.read_text().splitlines() if line.strip()]
        if args.plot:
            plot(summaries, args.plot)
        if args.bars:
            plot_steps(summaries, args.bars)
        return 0
    print(json.dumps(summarize(json.loads(args.input.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
