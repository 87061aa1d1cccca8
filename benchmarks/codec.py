"""`lhc-bench codec`: encode/decode time against memcpy, and bytes on the wire against the info bound.

Each case draws W workers' buckets of n float32 elements with independent random supports of the given
density (values N(0, 1)). At block > 1 the support is block-sparse by default (``--support blocks``:
``density`` is the fraction of items that are nonzero, every element of such an item nonzero, as in
embedding rows); ``--support elements`` scatters single elements instead, which at block 32 and 1% makes
92% of the items nonzero in the union, where the sketch outgrows the dense bucket.

Each case runs one warm-up aggregation on an independent draw to learn the bucket's
state (the steady state of training: sizes and scale come from the previous round), then repeats the
measured aggregation. Times are per worker (the mean over workers of the time spent encoding and
decoding in one aggregation), medians over repeats; ``memcpy_s`` is the median time of copying one dense
float32 bucket into a preallocated buffer, measured in the same run. Outputs go to preallocated buffers
too (as a DDP hook writes into its bucket). One JSON object per case on stdout; progress on stderr.

``gpu_launches`` (every row): the device operations the codec's GPU path takes for the case, encode and
decode apart (``benchmarks.codec_launches``). ``--device cuda`` runs the GPU path itself, prints a line
per case on stderr (times against the device's memcpy, launches, exactness) and adds the profiler's
count for one worker (``profiled_launches``). ``--layout`` picks the sketch's layout (auto: plain on a
GPU, fused on a CPU; docs/codec.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

from benchmarks import figures
from benchmarks.codec_launches import counted_launches, interpreter_for, profiled_launches
from benchmarks.codec_peeling import peel_trials

DEFAULT_LENGTH = 1 << 24
SWEEP_DENSITIES = (0.001, 0.01, 0.05)
SWEEP_BLOCKS = (1, 32)


MODES = ("sketch", "union", "dense")
#: The compiled kernels, or the torch code they are held to (what an install without a compiler runs).
KERNELS = ("native", "torch")


def _items(text: str, parse, ok, what: str) -> list:
    """A comma-separated list, every item checked: argparse reports the first bad one by name."""
    try:
        values = [parse(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None
    bad = [v for v in values if not ok(v)]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"{what}: {bad or text!r} out of range")
    return values


def _densities(text: str) -> list[float]:
    return _items(text, float, lambda v: 0 < v <= 1, "densities in (0, 1]")


def _blocks(text: str) -> list[int]:
    return _items(text, int, lambda v: v >= 1, "blocks >= 1")


def _modes(text: str) -> list[str]:
    return _items(text, str, lambda v: v in MODES, f"modes among {', '.join(MODES)}")


def _at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high if high else 'inf'}")
        return value
    return parse


def _layouts(text: str) -> list[str]:
    return _items(text, str, lambda v: v in ("auto", "fused", "plain"), "layouts among auto, fused, plain")


def _kernels(text: str) -> list[str]:
    return _items(text, str, lambda v: v in KERNELS, f"kernels among {', '.join(KERNELS)}")


def _margin(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"the margin must be >= 0, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--length", type=_at_least(1), default=DEFAULT_LENGTH,
                        help="elements per bucket (default %(default)s)")
    parser.add_argument("--density", type=_densities, default=[0.01],
                        help="nonzero fraction per worker, a,b,.. in (0, 1] (default 0.01)")
    parser.add_argument("--workers", type=_at_least(1, 32), default=8, help="1..32 (default %(default)s)")
    parser.add_argument("--mode", type=_modes, default=["sketch", "union"],
                        help="sketch,union,dense (default sketch,union)")
    parser.add_argument("--block", type=_blocks, default=[1], help="elements per item, a,b,.. (default 1)")
    parser.add_argument(
        "--support",
        choices=("blocks", "elements"),
        default="blocks",
        help="nonzeros drawn as whole items (blocks) or as single elements; the same at block 1",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layout", type=_layouts, default=["auto"],
                        help="sketch layouts, auto,fused,plain (default auto: plain on a GPU, fused on CPU)")
    parser.add_argument("--no-gpu-launches", action="store_true",
                        help="skip counting the GPU path's launches (on a CPU it runs worker 0 in Triton's "
                             "interpreter, which takes a few seconds per case)")
    parser.add_argument("--repeats", type=_at_least(1), default=5, help="(default %(default)s)")
    parser.add_argument("--margin", type=_margin, default=None, help="sketch capacity margin (codec default)")
    parser.add_argument("--seed", type=int, default=0, help="(default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="JSON lines (the only output; accepted like lhc-bench switch's)")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help=f"densities {SWEEP_DENSITIES} x blocks {SWEEP_BLOCKS} (overrides --density/--block)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--system-malloc",
        action="store_true",
        help="keep glibc's default mmap threshold (every large temporary then costs page faults)",
    )
    parser.add_argument("--peel-trials", type=_at_least(0), default=0,
                        help="also measure peeling failures, N rounds (default 0)")
    parser.add_argument("--peel-candidates", type=_at_least(1),
                        help="candidates per peeling trial (default: the first case's union)")
    parser.add_argument("--kernels", type=_kernels, default=["native"],
                        help="native,torch: the compiled kernels, the torch reference, or both side by side "
                             "(each in its own process; default native)")
    parser.add_argument("--plot", metavar="FILE.png", help="write a plot of the cases")


def _tune_malloc() -> bool:
    """Keep freed memory in the process (like PyTorch's CUDA caching allocator does on GPUs): glibc
    otherwise maps and unmaps every tensor above 32 MiB, and on this VM page faults then cost about as
    much as the work itself. memcpy_s does not allocate, so this only removes allocation noise."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    mmap_ok = bool(libc.mallopt(m_mmap_threshold, 1 << 30))
    return mmap_ok and bool(libc.mallopt(m_trim_threshold, (1 << 31) - 1))


def _draw(
    n: int, density: float, workers: int, gen: torch.Generator, device: str, block: int = 1
) -> list[torch.Tensor]:
    """W buckets with ``density * n / block`` random nonzero items of ``block`` elements each (drawn on the
    generator's device: a GPU draws a 2^24 bucket far faster)."""
    items = (n + block - 1) // block
    k = round(items * density)
    on = gen.device
    xs = []
    for _ in range(workers):
        x = torch.zeros(items * block, device=on)
        chosen = torch.randperm(items, generator=gen, device=on)[:k]
        positions = (chosen.unsqueeze(1) * block + torch.arange(block, device=on)).view(-1)
        x[positions] = torch.randn(positions.numel(), generator=gen, device=on)
        xs.append(x[:n].contiguous().to(device))
    return xs


def info_bound_bytes(n_items: int, union: int, block: int) -> float:
    """log2 C(n_items, union) / 8 + 4 * block * union: the index's entropy plus the values."""
    log_comb = math.lgamma(n_items + 1) - math.lgamma(union + 1) - math.lgamma(n_items - union + 1)
    bits = log_comb / math.log(2)
    return bits / 8 + 4 * block * union


def _union_items(xs: list[torch.Tensor], block: int) -> int:
    n = xs[0].numel()
    items = (n + block - 1) // block
    held = torch.zeros(items * block, dtype=torch.bool, device=xs[0].device)
    for x in xs:
        held[:n] |= x != 0
    return int(held.view(items, block).any(dim=1).sum())


def _exact(result, xs: list[torch.Tensor]) -> bool:
    """The total is bit for bit the dequantized sum of the workers' quantized integers."""
    from host_agent.codec.quantize import dequantize, quantize

    s = result.stats["scale"]
    acc = torch.zeros(xs[0].numel(), dtype=torch.int64, device=xs[0].device)
    for x in xs:
        acc += quantize(x, s)
    return bool(torch.equal(result.total, dequantize(acc.to(torch.int32), s, torch.float32)))


def _memcpy_s(src: torch.Tensor, dst: torch.Tensor) -> float:
    if src.is_cuda:
        torch.cuda.synchronize(src.device)
    start = time.perf_counter()
    dst.copy_(src)
    if src.is_cuda:
        torch.cuda.synchronize(src.device)
    return time.perf_counter() - start


def run_case(args: argparse.Namespace, mode: str, density: float, block: int, layout: str = "auto") -> dict:
    from host_agent.codec import aggregate_local
    from host_agent.codec.cpu import kernel_simd, native_available

    options = {"timing": True, "layout": layout}
    if args.margin is not None:
        options["margin"] = args.margin
    gen = torch.Generator(device="cuda" if args.device.startswith("cuda") else "cpu").manual_seed(args.seed)
    draw_block = block if args.support == "blocks" else 1
    warm = _draw(args.length, density, args.workers, gen, args.device, draw_block)
    state = aggregate_local(warm, mode=mode, block=block, **options).state
    del warm
    xs = _draw(args.length, density, args.workers, gen, args.device, draw_block)
    outs = [torch.empty_like(x) for x in xs]
    dst = torch.empty_like(xs[0])
    dst.copy_(xs[0])  # fault its pages in now: memcpy_s times a copy, not the first touch of memory
    encode, decode, memcpy, stages, result = [], [], [], [], None
    for _ in range(args.repeats):
        memcpy.append(_memcpy_s(xs[0], dst))
        result = aggregate_local(xs, mode=mode, block=block, state=state, outs=outs, **options)
        encode.append(result.stats["encode_s"])
        decode.append(result.stats["decode_s"])
        stages.append(result.stats["stage_s"])
        memcpy.append(_memcpy_s(xs[0], dst))
    assert result is not None
    stats = result.stats
    launches, profiled = None, None
    if not args.no_gpu_launches:
        launches = counted_launches(xs, mode, block, state, options)
        if xs[0].is_cuda:
            try:
                profiled = profiled_launches(xs[0], mode, block, options)
            except Exception as exc:  # the profiler (CUPTI) may be missing: the row stands without it
                profiled = {"error": repr(exc)}
    n_items = (args.length + block - 1) // block
    union = _union_items(xs, block)
    bound = info_bound_bytes(n_items, union, block)
    mc = statistics.median(memcpy)
    enc, dec = statistics.median(encode), statistics.median(decode)
    return {
        "mode": mode,
        "length": args.length,
        "density": density,
        "workers": args.workers,
        "block": block,
        "support": args.support,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(xs[0].device) if xs[0].is_cuda else None,
        "layout": stats["layout"],
        "encode_s": enc,
        "decode_s": dec,
        "memcpy_s": mc,
        "encode_memcpy": enc / mc,
        "decode_memcpy": dec / mc,
        # the timed stages of decode (index query, peel, output, granularity choice), medians
        "stage_s": {key: statistics.median(s.get(key, 0.0) for s in stages) for key in stages[-1]},
        "bytes_per_worker": stats["bytes_per_worker"],
        "header_bytes_per_worker": stats["header_bytes_per_worker"],
        "dense_bytes": 4 * args.length,
        "info_bound_bytes": round(bound),
        "bytes_info": stats["bytes_per_worker"] / bound,
        "exact": _exact(result, xs),
        "rounds": stats["rounds"],
        "union_items": union,
        "candidates": stats["candidates"],
        "residue": stats["residue"],
        "index": stats["index"],
        "sketch_cells": stats.get("sketch_cells", 0),
        "peel_rounds": stats.get("peel_rounds", 0),
        "scale_redo": stats.get("scale_redo", False),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        # the compiled CPU kernels (peeling, set bits); without them the torch code runs, slower
        "native_kernels": native_available() and args.device == "cpu",
        "kernels": "native" if native_available() else "torch",
        "simd": kernel_simd(),  # the kernels' hash and Bloom loops: "avx2" or "scalar" (None: torch)
        "codec_kernels": stats["kernels"],  # what ran the measured aggregation: native/..., torch or triton
        "gpu_launches": launches,  # the GPU path's device operations (None: not counted, or no Triton)
        "profiled_launches": profiled,  # a CUDA device only: one worker's, the profiler's list beside
    }


def _device_line(case: dict) -> str:
    """One line a person reads: the case, times against the device's memcpy, launches, exactness."""
    launches = case["gpu_launches"] or {}
    return (f"{case['device_name']}: {case['mode']} {case['density']:g} block {case['block']} layout "
            f"{case['layout']}: encode {case['encode_s'] * 1e6:.0f} us = {case['encode_memcpy']:.2f} memcpy, "
            f"decode {case['decode_s'] * 1e6:.0f} us = {case['decode_memcpy']:.2f} memcpy (memcpy "
            f"{case['memcpy_s'] * 1e6:.0f} us), launches encode {launches.get('encode')} decode "
            f"{launches.get('decode')} (host waits {launches.get('decode_waits')}), exact {case['exact']}")


def _plot(cases: list[dict], path: str) -> None:
    plt = figures.pyplot()
    labels = [f"{c['mode']}\n{c['density'] * 100:g}% b{c['block']}\n{c['kernels']}" for c in cases]
    fig, axes = plt.subplots(1, 3, figsize=(max(9, 1.1 * len(cases) * 3 / 2), 4))
    for ax, key, title in zip(
        axes,
        ("bytes_info", "encode_memcpy", "decode_memcpy"),
        ("bytes / info bound", "encode / memcpy", "decode / memcpy"),
        strict=True,
    ):
        colors = ["C0" if c["mode"] == "sketch" else "C1" for c in cases]
        ax.bar(range(len(cases)), [c[key] for c in cases], color=colors)
        ax.set_xticks(range(len(cases)), labels, fontsize=7)
        ax.set_title(title)
        ax.set_yscale("log" if key != "bytes_info" else "linear")
    fig.suptitle(f"lhc codec, n={cases[0]['length']}, {cases[0]['workers']} workers, {cases[0]['device']}")
    figures.save(fig, path, dpi=120)


def _other_kernels(argv: list[str], kernels: str) -> list[dict]:
    """The same cases with ``kernels`` (LHC_CODEC_KERNELS is read once, at import): in a child process
    given this run's ``argv`` (the last --kernels wins; the peeling trials stay here, and this process
    writes the plot after the child, with every case)."""
    from host_agent.codec.cpu import KERNELS_VARIABLE

    env = {**os.environ, KERNELS_VARIABLE: kernels}
    command = [sys.executable, "-m", "benchmarks.cli", *argv, "--kernels", kernels, "--peel-trials", "0"]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from host_agent.codec.cpu import KERNELS_VARIABLE, native_available

    # on a GPU the CPU kernels do not run (the GPU path or LHC_CODEC_GPU=torch does): nothing to refuse
    here = "native" if native_available() or args.device.startswith("cuda") else "torch"
    if "native" in args.kernels and here == "torch" and KERNELS_VARIABLE not in os.environ:
        print("lhc-bench codec: the compiled kernels are not built (pip install -e . with a C compiler);"
              " --kernels torch measures the torch code", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    tuned = False if args.system_malloc else _tune_malloc()
    densities = list(SWEEP_DENSITIES) if args.sweep else args.density
    blocks = list(SWEEP_BLOCKS) if args.sweep else args.block
    combos = [(m, d, b) for d in densities for b in blocks for m in args.mode]
    cases = []
    if here in args.kernels:
        combos = [(*combo, layout) for combo in combos for layout in args.layout
                  if combo[0] == "sketch" or layout == args.layout[0]]  # the layout matters to sketch only
        progress = tqdm(combos, desc="codec cases", file=sys.stderr, disable=len(combos) < 2)
        for mode, density, block, layout in progress:
            with interpreter_for(args.device):
                case = run_case(args, mode, density, block, layout)
            case["malloc_tuned"] = tuned
            cases.append(case)
            print(json.dumps(case), flush=True)
            if args.device.startswith("cuda"):
                print(_device_line(case), file=sys.stderr, flush=True)
    for kernels in args.kernels:
        if kernels != here:
            for case in _other_kernels(args.argv, kernels):
                cases.append(case)
                print(json.dumps(case), flush=True)
    if args.peel_trials:
        from host_agent.codec import DEFAULT_MARGIN

        margin = DEFAULT_MARGIN if args.margin is None else args.margin
        union = args.peel_candidates
        if union is None:
            gen = torch.Generator().manual_seed(args.seed)
            union = _union_items(_draw(args.length, densities[0], args.workers, gen, args.device), 1)
        print(json.dumps(peel_trials(args.length, union, margin, args.peel_trials, args.seed, args.device)))
    if args.plot and cases:
        _plot(cases, args.plot)
    return 0 if all(c["exact"] for c in cases) else 1
