"""The codec's GPU path (Triton kernels) held to the CPU kernels and the torch reference, bit for bit, and
its launch count.

Where a CUDA device is present (``make gpu-check``) the kernels run compiled on it; elsewhere they run
in Triton's interpreter on CPU tensors, at small sizes (the interpreter runs each step of a tile as a
numpy call), with small tiles so that many programs and every tile's edge are exercised. Without Triton
the module is skipped, saying so.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the GPU path needs Triton: pip install -e '.[gpu]'")
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - a user's setting
    pytest.skip("no CUDA device, and TRITON_INTERPRET is set to something other than 1",
                allow_module_level=True)

from host_agent.codec import AggregationError, aggregate_local, gpu  # noqa: E402
from host_agent.codec.granularity import choose_group  # noqa: E402
from host_agent.codec.hashing import MASK32, derive_seed  # noqa: E402
from host_agent.codec.index import IndexSpec, bitmap_spec, encode_index, query_index  # noqa: E402
from host_agent.codec.items import nonzero_items, nonzero_rows  # noqa: E402
from host_agent.codec.output import OutputRange  # noqa: E402
from host_agent.codec.peeling import peel, peel_parallel  # noqa: E402
from host_agent.codec.quantize import dequantize, exponent_field, quantize, scale_for  # noqa: E402
from host_agent.codec.sketch import cell_ids, encode_sketch, encode_sketch_torch, sketch_cells  # noqa: E402
from host_agent.codec.sketch_spec import SketchSpec  # noqa: E402
from lhc_ina.constants import LANES  # noqa: E402
from tests.test_codec import make_inputs  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")


@pytest.fixture
def small_tiles():
    """Interpreted, tiles of a few dozen lanes: many programs, and every edge of a tile is reached (the
    whole aggregations below run the interpreter's large tiles: their time is the interpreter's steps)."""
    if CUDA:
        yield
        return
    previous = gpu.set_sizes(scan=64, items=64, words=4, peel=512, fill=64)
    yield
    gpu.set_sizes(**previous)



def on_gpu(fn, *args):
    """``fn(*args)`` on the GPU path, its tensors moved to the device, the result back on the CPU."""
    moved = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    with gpu.path("triton"):
        out = fn(*moved)
    return tuple(o.cpu() if isinstance(o, torch.Tensor) else o for o in out) if isinstance(out, tuple) \
        else out.cpu() if isinstance(out, torch.Tensor) else out


def sparse(seed: int, n: int, density: float, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-30, 30, (n,), generator=g)
    x = torch.where(torch.rand(n, generator=g) < density, x, 0.0)
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32) * (x != 0)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("block", [1, 3, 32])
def test_the_scan_counts_the_nonzero_items_and_the_header_figures(dtype, block, small_tiles):
    from host_agent.codec.gpu.encoding import scan_nonzero

    x = sparse(block, 3001, 0.05, dtype)
    scan = on_gpu(scan_nonzero, x, block)
    items = nonzero_items(x, block)
    assert scan.items == items.numel()
    if dtype == torch.int32:
        assert (scan.lo, scan.hi) == (int(x.min()), int(x.max()))
    else:
        assert (scan.field, scan.finite) == exponent_field(nonzero_rows(x, block)[1])


@pytest.mark.parametrize("special", [float("inf"), float("-inf"), float("nan")])
def test_the_scan_sees_a_value_that_is_not_finite(special, small_tiles):
    from host_agent.codec.gpu.encoding import scan_nonzero

    x = sparse(5, 777, 0.1, torch.float32)
    x[700] = special
    scan = on_gpu(scan_nonzero, x, 1)
    assert not scan.finite and scan.field is None and scan.items == nonzero_items(x, 1).numel()


@pytest.mark.parametrize(("dtype", "block", "kind", "group"), [
    (torch.float32, 1, "bitmap", 1), (torch.float16, 3, "bloom", 1), (torch.bfloat16, 1, "bloom", 4),
    (torch.int32, 32, "bitmap", 4)])
def test_one_pass_encodes_the_index_and_the_sketch_as_the_cpu_does(dtype, block, kind, group, small_tiles):
    """``encode_bucket`` (the index, the sketch and the header's figures from one pass over the bucket, no
    list of items) writes the CPU's words from its items and rows: every dtype, blocks, both indexes,
    groups, both layouts, an assumed scale that saturates (clamped) and one that does not."""
    from host_agent.codec.gpu.encoding import encode_bucket, scan_nonzero, summarize
    from host_agent.codec.index import bloom_masks

    x = sparse(block + group, 1201, 0.08, dtype)
    x[x.isinf()] = -3  # float16's overflows: a bucket that is not finite is never quantized
    n_items = -(-x.numel() // block)
    items, rows = nonzero_rows(x, block)
    if kind == "bitmap":
        spec = bitmap_spec(n_items, group)
    else:
        spec = IndexSpec("bloom", n_items, 61, 5, derive_seed(group, block), group)
    fitting = scale_for(exponent_field(rows)[0], 8)  # the agreed scale of 8 such workers
    for layout, scale, clamp in [("fused", fitting, False), ("plain", fitting + 30, True)]:
        sketch = SketchSpec(331, block, derive_seed(block, scale), layout)
        words = torch.zeros(spec.words, dtype=torch.int32, device=DEVICE)
        cells = torch.zeros(sketch.words, dtype=torch.int32, device=DEVICE)
        quantized = rows if dtype == torch.int32 else quantize(rows, scale, clamp)
        masks = bloom_masks(spec, DEVICE)
        with gpu.path("triton"):
            stats = encode_bucket(x.to(DEVICE), block, kind, group, spec.seed & MASK32, masks, words, sketch,
                                  cells, None if dtype == torch.int32 else scale, clamp)
        assert torch.equal(words.cpu(), encode_index(spec, items)), layout
        assert torch.equal(cells.cpu(), encode_sketch_torch(sketch, items, quantized)), layout
        assert summarize(stats.cpu(), dtype != torch.int32) == on_gpu(scan_nonzero, x, block)


LEADS = [(torch.float32, "random", 0), (torch.bfloat16, "random", 31), (torch.float16, "nan", 6),
         (torch.float32, "zero", 2), (torch.int32, "random", 3), (torch.int32, "beyond", 17),
         (torch.float32, "dense", 1), (torch.float16, "nan", 600), (torch.int32, "beyond", 1023)]


@pytest.mark.parametrize(("dtype", "case", "rank"), LEADS)
def test_the_lead_is_written_on_the_device_as_the_host_writes_it(dtype, case, rank):
    """``encode_lead`` writes the agreement message and the header from the scan's figures as
    ``agreement_words`` and ``header_words`` do from them on the host: both halves of the item count
    (dense: over 2^16 items), the exponent's bit (none for an all-zero bucket), a worker's bit for a NaN
    (its sketch then zeroed) or an integer beyond the bound, ranks 0 to 31 (bit 31: a negative word) and
    of a job past one switch (600, 1023: the agreement's presence and the flags' second word)."""
    from host_agent.codec.agreement import AGREE_WORDS, agreement_words
    from host_agent.codec.gpu.encoding import encode_lead, scan_stats, summarize
    from host_agent.codec.quantize import HEADER_WORDS, header_words, int_bound

    x = sparse(rank, 70_001 if case == "dense" else 3001, 1.0 if case == "dense" else 0.05, dtype)
    if case == "nan":
        x[100] = float("nan")
    elif case == "zero":
        x.zero_()
    elif case == "beyond":
        x[7] = int_bound(4) + 1
    previous = None if CUDA else gpu.set_sizes(scan=256, fill=4)  # many programs, several rows each
    try:
        with gpu.path("triton"):
            stats = scan_stats(x.to(DEVICE), 1)
            out = torch.zeros(AGREE_WORDS + HEADER_WORDS, dtype=torch.int32, device=DEVICE)
            sketch = torch.ones(37, dtype=torch.int32, device=DEVICE)
            encode_lead(stats, out, rank, 0xDEADBEEF, 4, dtype != torch.int32, sketch)
    finally:
        if previous is not None:
            gpu.set_sizes(**previous)
    scan = summarize(stats.cpu(), dtype != torch.int32)
    bound, cpu = int_bound(4), torch.device("cpu")
    expected = torch.cat([agreement_words(rank, 0xDEADBEEF, scan.items, cpu),
                          header_words(scan.field, rank, finite=scan.finite, support_complete=True,
                                       in_bound=-bound <= scan.lo and scan.hi <= bound, device=cpu)])
    assert torch.equal(out.cpu(), expected)
    assert (sketch.count_nonzero().item() == 0) == (case == "nan")
    assert (scan.items >= 1 << 16) == (case == "dense")


def float_bits(seed: int, n: int) -> torch.Tensor:
    """Floats from random bits: every exponent (subnormals included), both signs, ties and zeros."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32).clone()
    x[~torch.isfinite(x)] = 0.0
    x[:8] = torch.tensor([0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5])
    return x


@pytest.mark.parametrize("seed", range(2))
def test_quantizing_rounds_exactly_as_torch_does(seed):
    """Ties to even, subnormals, saturation under an assumed scale: the kernels' quantizing, from the
    float's bits, equals ``quantize.quantize`` at every scale a bucket can take."""
    from host_agent.codec.gpu.encoding import encode_sketch as encode_sketch_triton
    from host_agent.codec.gpu.encoding import gather_quantize

    x = float_bits(seed, 4000)
    g = torch.Generator().manual_seed(100 + seed)
    for scale in [int(s) for s in torch.randint(-110, 160, (6,), generator=g)] + [0, 150]:
        y = x * 2.0**scale if abs(scale) < 127 else x.double() * 2.0**scale
        fits = y.abs() < 2**31 - 128
        cands = torch.nonzero(fits).squeeze(1)
        got = on_gpu(gather_quantize, x, cands, 1, scale)
        assert torch.equal(got, quantize(x[cands].unsqueeze(1), scale)), scale
        spec = SketchSpec(997, 1, derive_seed(seed, scale))  # clamped: saturating values included
        items = torch.arange(x.numel(), dtype=torch.int64)
        words = on_gpu(encode_sketch_triton, spec, items, x.unsqueeze(1), scale, True)
        clamped = quantize(x.unsqueeze(1), scale, True)
        assert torch.equal(words, encode_sketch_torch(spec, items, clamped)), scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
@pytest.mark.parametrize(("block", "output_range"), [(1, None), (1, (1000, 2500)), (4, (3, 3997)), (4, None)])
def test_the_output_is_dequantized_and_written_as_torch_writes_it(dtype, block, output_range, small_tiles):
    from host_agent.codec.gpu.decoding import fill_output

    n = 3998
    g = torch.Generator().manual_seed(block)
    cands = torch.unique(torch.randint(0, -(-n // block), (300,), generator=g))
    values = torch.randint(-(2**31), 2**31, (cands.numel(), block), generator=g, dtype=torch.int64)
    values = values.to(torch.int32)
    out_range = OutputRange.of(output_range, n)
    scales = [None] if dtype == torch.int32 else [0, 40, 160, -100, 270]  # 270: subnormal results
    for scale in scales:
        expected = torch.empty(out_range.size, dtype=dtype)
        run = out_range.candidates(cands, block)
        rows = values[run] if scale is None else dequantize(values[run], scale, dtype)
        out_range.fill(expected, cands[run], rows, block)
        out = torch.full((out_range.size,), 7, dtype=dtype, device=DEVICE)
        with gpu.path("triton"):
            fill_output(out, out_range.lo, cands.to(DEVICE), values.to(DEVICE), block, scale)
        assert torch.equal(out.cpu(), expected), scale


@pytest.mark.parametrize("kind", ["bitmap", "bloom"])
@pytest.mark.parametrize("group", [1, 4, 64])
def test_the_index_is_encoded_and_queried_as_on_the_cpu(kind, group, small_tiles):
    n_items = 50_001
    g = torch.Generator().manual_seed(group)
    items = torch.unique(torch.randint(0, n_items, (900,), generator=g))
    if kind == "bitmap":
        spec = bitmap_spec(n_items, group)
    else:
        spec = IndexSpec("bloom", n_items, 97, 5, derive_seed(group, 1), group)
    words = on_gpu(encode_index, spec, items)
    assert torch.equal(words, encode_index(spec, items))
    other = encode_index(spec, torch.unique(torch.randint(0, n_items, (700,), generator=g)))
    summed = words | other
    assert torch.equal(on_gpu(query_index, spec, summed), query_index(spec, summed))


PEELS = [("fused", 1, 0.8), ("plain", 1, 0.8), ("fused", 3, 0.8), ("plain", 2, 0.95), ("fused", 1, 0.95)]


@pytest.mark.parametrize(("layout", "block", "load"), PEELS)
def test_peeling_recovers_what_the_cpu_recovers(layout, block, load):
    """Complete peels and partial ones (load 0.95: past the plain layout's threshold, a 2-core is left):
    the same candidates, the same values, whatever order the programs took."""
    k = 14_000  # 17,500 cells at load 0.8: fused from 16,384
    g = torch.Generator().manual_seed(int(load * 100) + block)
    items = torch.randperm(1 << 22, generator=g)[:k].sort().values
    values = torch.randint(-(2**31), 2**31, (k, block), generator=g, dtype=torch.int64).to(torch.int32)
    spec = SketchSpec(int(k / load), block, derive_seed(k, block), layout)
    cells = encode_sketch_torch(spec, items, values).view(spec.cells, block)
    assert torch.equal(on_gpu(encode_sketch, spec, items, values), cells.view(-1))
    expected = peel_parallel(cell_ids(spec, items), cells)
    # interpreted: three programs serving the queue in turn, tiles of 256 slots (the first program peels
    # what its share frees, the others find it done: one legal interleaving of many)
    previous = None if CUDA else gpu.set_sizes(programs=3, peel=256)
    try:
        with gpu.path("triton"):
            got = peel(spec, items.to(DEVICE), cells.to(DEVICE))
    finally:
        if previous:
            gpu.set_sizes(**previous)
    assert torch.equal(got.peeled.cpu(), expected.peeled) and torch.equal(got.values.cpu(), expected.values)
    assert got.complete == bool(expected.peeled.all())
    assert torch.equal(peel(spec, items, cells).values, expected.values)  # the CPU kernel, too


@pytest.mark.parametrize("block", [1, 4])
@pytest.mark.parametrize("shape", ["few", "many", "between windows", "none"])
def test_the_granularity_choice_counts_as_on_the_cpu(block, shape, monkeypatch):
    """Fewer candidates than the sample (all counted), more (the spread windows), a union that lies wholly
    between the windows (counted again, whole), and none at all; counted by its own kernel and by the
    output's. Windows are made small (8 of 128 candidates instead of 64 of 1024) so that the interpreter
    runs few programs; the kernels take the window as a constant and place the windows from the counts
    they are given."""
    from host_agent.codec import granularity

    monkeypatch.setattr(granularity, "_WINDOWS", 8)
    monkeypatch.setattr(granularity, "_WINDOW", 128)
    k = 600 if shape == "few" else 3000
    g = torch.Generator().manual_seed(k + block)
    cands = torch.unique(torch.randint(0, 1 << 22, (k + k // 4,), generator=g))[:k]
    values = torch.randint(-5, 5, (k, block), generator=g, dtype=torch.int32)
    values[torch.rand(k, generator=g) < 0.7] = 0
    if shape == "between windows":
        values.zero_()
        values[200:300] = 3  # the first window is [0, 128), the second starts at 2872 // 7 = 410
    elif shape == "none":
        values.zero_()
    expected = choose_group(1 << 22, cands, values, 5.0)
    assert on_gpu(choose_group, 1 << 22, cands, values, 5.0) == expected
    # the output kernel counts the same figures beside a shard's output (all candidates, whatever the range)
    from host_agent.codec.gpu.decoding import fill_output

    out = torch.empty(5000, dtype=torch.int32, device=DEVICE)
    moved = cands.to(DEVICE), values.to(DEVICE)
    with gpu.path("triton"):
        counted = fill_output(out, 1 << 20, *moved, block, None, granularity.count_windows(k))
        assert choose_group(1 << 22, *moved, 5.0, counted) == expected


CASES = [(mode, block, dtype) for mode in ("sketch", "union", "dense") for block in (1, 8)
         for dtype in (torch.int32, torch.float32)]


@pytest.mark.parametrize(("mode", "block", "dtype"), CASES)
def test_an_aggregation_on_the_gpu_path_equals_the_cpu_one(mode, block, dtype):
    xs = make_inputs(21, 4, 20_001, "random", 0.03, dtype=dtype)
    cpu = aggregate_local(xs, mode=mode, block=block)
    state = cpu.state
    for _ in range(2):  # a first round (sizing) and a steady one (the state's estimate and scale)
        ours = aggregate_local([x.to(DEVICE) for x in xs], mode=mode, block=block, kernels="triton",
                               layout="fused", state=None if _ == 0 else state)
        ref = cpu if _ == 0 else aggregate_local(xs, mode=mode, block=block, state=state)
        assert torch.equal(ours.total.cpu(), ref.total) and ours.state == ref.state
        for key in ("bytes_per_worker", "rounds", "candidates", "residue", "scale", "next_group"):
            assert ours.stats.get(key) == ref.stats.get(key), key
        assert ours.stats["kernels"] == "triton"


@pytest.mark.parametrize("case", ["bloom", "output range", "residue", "scale redo", "not finite", "support"])
def test_the_gpu_path_takes_every_turn_of_the_protocol_alike(case):
    """A Bloom index (low density), a shard's decode, a peel that leaves a residue (a sketch forced too
    small), an assumed scale that does not hold, a NaN on one worker, supports given (the index and
    sketch written from the items, not by one pass): the CPU's totals and stats."""
    xs = make_inputs(3, 4, 40_000, "random", 0.002 if case == "bloom" else 0.02, dtype=torch.float32)
    options: dict = {"mode": "sketch"}
    if case == "bloom":
        options["index"] = "bloom"
    elif case == "output range":
        options["output_range"] = (10_001, 30_000)
    elif case == "residue":
        options["cells"] = 2400
    elif case == "scale redo":
        options["state"] = aggregate_local([x * 1e-6 for x in xs]).state
    elif case == "support":
        options.update(state=aggregate_local(xs).state, supports=[torch.nonzero(x).squeeze(1) for x in xs])
    else:
        xs[2][17] = float("nan")
    if case == "output range":
        cpu = _aggregate_range(xs, {}, options)
        ours = _aggregate_range([x.to(DEVICE) for x in xs], {"kernels": "triton"}, options)
    else:
        cpu = aggregate_local(xs, **options)
        ours = aggregate_local([x.to(DEVICE) for x in xs], kernels="triton", **options)
    assert torch.equal(ours.total.cpu().nan_to_num(), cpu.total.nan_to_num())
    assert torch.equal(ours.total.cpu().isnan(), cpu.total.isnan())
    keys = ("bytes_per_worker", "rounds", "candidates", "residue", "scale_redo", "index", "nonfinite_ranks")
    for key in keys:
        assert ours.stats.get(key) == cpu.stats.get(key), key
    if case == "residue":
        assert cpu.stats["residue"] > 0


@pytest.mark.parametrize("case", ["bitmap", "bloom", "not finite"])
def test_a_steady_first_round_leaves_as_the_cpu_sends_it(case):
    """With a state (the steady case), the GPU path's first round (the agreement, the header and index,
    the sketch: views of one buffer, written by one pass over the bucket and one copy) carries the CPU's
    words, word for word; a worker whose input is not finite sends a zero sketch, as on the CPU."""
    from host_agent.codec import WorkerSession

    xs = make_inputs(5, 2, 20_001, "random", 0.03, dtype=torch.float32)
    state = aggregate_local(xs).state
    if case == "not finite":
        xs[1][404] = float("nan")
    options = {"state": state, "layout": "plain", "index": "bloom" if case == "bloom" else "auto"}
    sent = []
    for x, local in ((xs[1], {}), (xs[1].to(DEVICE), {"kernels": "triton"})):
        session = WorkerSession(x, 1, 2, **options, **local)
        sent.append([session.next_message() for _ in range(3)])
    cpu, ours = sent
    assert [(m.op.name, m.kind) for m in ours] == [(m.op.name, m.kind) for m in cpu] == [
        ("ADD", "agree"), ("OR", "index"), ("ADD", "sketch")]
    for mine, theirs in zip(ours, cpu, strict=True):
        assert torch.equal(mine.words.cpu(), theirs.words), mine.kind
    assert (ours[2].words.count_nonzero() == 0) == (case == "not finite")


def _aggregate_range(xs, local: dict, options: dict):
    """Every worker decodes only its range; worker 0's total and stats."""
    from host_agent.codec import WorkerSession, reduce_words

    sessions = [WorkerSession(x, r, len(xs), **local, **options) for r, x in enumerate(xs)]
    while True:
        msgs = [s.next_message() for s in sessions]
        if msgs[0] is None:
            break
        total = reduce_words(msgs[0].op, [m.words.cpu() for m in msgs])
        for s in sessions:
            s.receive(total)
    return sessions[0].result()


def test_decode_launches_do_not_grow_with_peeling_depth():
    """The same bucket under the fused layout (a peeling chain ~100 steps deep at this size) and the plain
    one (~25): decoding takes the same device operations and host waits, whatever the depth (the peel
    serves a work queue, no round is a launch or a wait): 11 operations (a Bloom index too) and 3
    waits to decode, 3 operations and no wait to encode. Worker 0 runs the GPU path, the others the
    CPU's, and their totals agree (aggregate_local checks). At the default case (n = 2^24) ``lhc-bench
    codec --json`` counts the same way (docs/codec.md)."""
    xs = [x.to(DEVICE) for x in make_inputs(8, 8, 1 << 18, "random", 0.01, dtype=torch.float32)]
    counted = {}
    for layout in ("fused", "plain"):
        state = aggregate_local(xs, layout=layout).state
        first = {"kernels": "triton", "count_launches": True}
        result = aggregate_local(xs, layout=layout, state=state, worker_options=[first] + [{}] * 7)
        counted[layout] = result.stats["gpu_launches"]
    fused, plain = counted["fused"], counted["plain"]
    assert fused == plain, counted
    assert fused["decode"] == 11 and fused["decode_waits"] == 3, counted
    assert fused["encode"] == 3 and fused["encode_waits"] == 0, counted


def test_the_launch_counter_counts_torch_operations_and_triton_launches():
    from host_agent.codec.gpu.encoding import encode_index as encode_index_triton

    counter = gpu.LaunchCounter(DEVICE)
    with gpu.counting(counter, "decode"):
        a = torch.zeros(8, device=DEVICE)  # a fill
        a.add_(1)  # a kernel
        a[2:].view(2, 3)  # views: none
        gpu.read_back(a)  # a copy, counted whether or not torch shows one
        items = torch.arange(5, device=DEVICE)  # a kernel
        encode_index_triton("bitmap", items, 1, 1, 0, None)  # a fill and one launch, not the interpreter's
        # own torch operations
        with gpu.on_host():  # host work, which under the interpreter looks like the device's: none
            torch.ones(3).add_(1)
    assert counter.counts == {"encode": 0, "decode": 6, "transfer": 0, "encode_waits": 0, "decode_waits": 1,
                              "transfer_waits": 0}


def test_a_counter_for_plain_cuda_counts_on_the_current_cuda_device(monkeypatch):
    """A CUDA tensor's device always names its index, and ``cuda`` != ``cuda:0``: a counter made for plain
    ``cuda`` (as the test above is on a GPU) takes the current device's index, or it would see no torch
    operation (on the H200 it counted 2 where the interpreter counts 6: only the noted launch and copy)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert gpu.LaunchCounter(torch.device("cuda")).device == torch.device("cuda", 1)
    assert gpu.LaunchCounter("cuda:0").device == torch.device("cuda", 0)
    assert gpu.LaunchCounter(torch.device("cpu")).device == torch.device("cpu")


def test_the_layout_is_a_job_property():
    """Workers that resolve the layout apart disagree at the agreement message, on every worker; the plain
    layout costs ~15% more sketch cells at the default case's size."""
    xs = make_inputs(4, 2, 5000, "random", 0.05)
    with pytest.raises(AggregationError, match="disagree on the codec parameters"):
        aggregate_local(xs, worker_options=[{"layout": "plain"}, {"layout": "fused"}])
    ratio = sketch_cells(1_296_187, 0.03, 1, LANES, "plain") / sketch_cells(1_296_187, 0.03, 1, LANES)
    assert 1.13 < ratio < 1.16


@pytest.mark.gpu
def test_a_gpu_session_sends_through_pinned_buffers_and_keeps_its_bucket():
    from host_agent.codec import WorkerSession
    from host_agent.codec.gpu.transfer import to_device, to_host

    x = make_inputs(1, 1, 10_000, "random", 0.05, dtype=torch.float32)[0].cuda()
    session = WorkerSession(x, 0, 1, mode="sketch", expected_items=600)
    while (msg := session.next_message()) is not None:
        assert msg.words.is_cuda
        host = to_host(msg.words)
        assert host.is_pinned()
        session.receive(host)
    total = session.result().total
    cpu = WorkerSession(x.cpu(), 0, 1, mode="sketch", expected_items=600)
    while (msg := cpu.next_message()) is not None:
        cpu.receive(msg.words)
    assert total.device == x.device and torch.equal(total.cpu(), cpu.result().total)
    assert session.result().stats["kernels"] == "triton" and session.result().stats["layout"] == "plain"
    assert to_device(torch.arange(4, dtype=torch.int32), x.device).is_cuda


def test_one_worker_alone_is_driven_as_the_profiled_benchmark_drives_it():
    """``lhc-bench codec --device cuda`` profiles one worker's advances alone (its messages come back from
    the host): driven so, its total is the CPU's and its launches are counted, transfers included."""
    from contextlib import nullcontext

    from benchmarks.codec_launches import drive_alone
    from host_agent.codec import WorkerSession

    x = make_inputs(2, 1, 30_000, "random", 0.02, dtype=torch.float32)[0].to(DEVICE)
    state = aggregate_local([x], kernels="triton").state
    session = WorkerSession(x, 0, 1, state=state, kernels="triton", count_launches=True)
    drive_alone(session, nullcontext)
    result = session.result()
    expected = aggregate_local([x.cpu()], state=state).total
    assert torch.equal(result.total.cpu(), expected) and result.stats["kernels"] == "triton"
    counted = result.stats["gpu_launches"]
    # a Bloom query makes its hits and their counts in one kernel, where a bitmap's bits are counted
    assert counted["decode"] == 11 and counted["encode"] == 3, counted
    # the host waits for the set bits' counts, the peel's count and the granularity counts; never to encode
    assert counted["decode_waits"] == 3 and counted["encode_waits"] == 0, counted
    assert counted["transfer"] == (2 if CUDA else 0)  # index, sketch to the device (a CPU has none; the
    # agreement is read where it was received, as is the header)
