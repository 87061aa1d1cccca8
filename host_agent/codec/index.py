"""The item index: which items any worker holds, aggregated by OR.

Two layouts, both OR-mergeable, chosen per round by the byte cost they imply:

- ``bitmap``: one bit per item (``n_items`` bits). Exact: the candidates are exactly the union.
- ``bloom``: a pattern-blocked Bloom filter. An item hashes to one 32-bit word and to one of 4096
  precomputed patterns of ``k`` distinct bits; inserting ORs the pattern into the word, a query is one
  load and one compare. False positives become extra candidates whose values are zero.

Granularity: an index entry may stand for ``group`` consecutive items (``granularity.py`` picks it from
the last aggregate); a marked entry makes all its items candidates. ``group`` 1 is one entry per item.

Sizing minimises the whole round's bytes, not the filter's alone: ``index bytes + expected false
positives * bytes per candidate`` (4 * block bytes in union mode, times the sketch's cells per candidate
in sketch mode), over a grid of filter sizes and ``k``, against the bitmap's fixed ``n_items / 8``. The
false-positive model is computed exactly for this layout (Poisson word occupancy, exact distribution of
the set bits in a word), in pure Python so that every worker takes the same decision.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import gpu
from .bits import pack_bits, set_bits, words_from_positions
from .cpu import kernel_threads, native, require_native
from .hashing import MASK32, hash_items, mix32, reduce_range

PATTERN_BITS = 12
_PATTERNS = 1 << PATTERN_BITS
_MAX_K = 12
_QUERY_CHUNK = 1 << 22


@dataclass(frozen=True)
class IndexSpec:
    """The agreed layout of one round's index (identical on every worker)."""

    kind: str  # "bitmap" or "bloom"
    n_items: int
    words: int
    k: int = 0
    seed: int = 0
    group: int = 1  # consecutive items per entry

    def __post_init__(self) -> None:
        if self.kind not in ("bitmap", "bloom"):
            raise ValueError(f"unknown index kind {self.kind!r}")
        if self.group < 1:
            raise ValueError(f"an index entry stands for at least one item, not {self.group}")

    @property
    def entries(self) -> int:
        return -(-self.n_items // self.group)


def bitmap_spec(n_items: int, group: int = 1) -> IndexSpec:
    """The exact bitmap over ``n_items`` items, one bit per ``group`` of them."""
    return IndexSpec("bitmap", n_items, (-(-n_items // group) + 31) // 32, group=group)


def group_entries(items: torch.Tensor, group: int) -> torch.Tensor:
    """The index entries of sorted, distinct ``items``: their groups, sorted and distinct."""
    if group == 1:
        return items
    return torch.unique_consecutive(torch.div(items, group, rounding_mode="floor"))


def expand_groups(entries: torch.Tensor, group: int, n_items: int) -> torch.Tensor:
    """Every item of the sorted ``entries`` (groups of ``group`` items), sorted, below ``n_items``."""
    if group == 1:
        return entries
    offsets = torch.arange(group, dtype=entries.dtype, device=entries.device)
    items = (entries.unsqueeze(1) * group + offsets).view(-1)
    if items.numel() and int(items[-1]) >= n_items:  # only the last group can reach past the bucket
        items = items[items < n_items]
    return items


@functools.cache
def _fp_by_occupancy(k: int, max_items: int) -> tuple[float, ...]:
    """P(a random k-bit pattern is covered by a word holding j items' patterns), j = 0..max_items.

    Markov chain over the number of set bits s in the word: one more item's k distinct bits overlap s set
    bits hypergeometrically. A query is covered with probability C(s, k) / C(32, k).
    """
    total = math.comb(32, k)
    dist = [1.0] + [0.0] * 32
    out = []
    for _ in range(max_items + 1):
        out.append(sum(p * math.comb(s, k) for s, p in enumerate(dist)) / total)
        nxt = [0.0] * 33
        for s, p in enumerate(dist):
            if p == 0.0:
                continue
            for overlap in range(max(0, k - (32 - s)), min(k, s) + 1):
                ways = math.comb(s, overlap) * math.comb(32 - s, k - overlap)
                nxt[s + k - overlap] += p * ways / total
        dist = nxt
    return tuple(out)


def bloom_fp_rate(items: int, words: int, k: int) -> float:
    """Expected false-positive probability of the pattern-blocked filter for a non-member item."""
    if items <= 0:
        return 0.0
    lam = items / words
    top = int(lam + 12 * math.sqrt(lam) + 24)
    table = _fp_by_occupancy(k, top)
    p = math.exp(-lam)  # Poisson(lam) at j = 0
    rate = 0.0
    for j in range(top + 1):
        rate += p * table[j]
        p *= lam / (j + 1)
    return min(rate, 1.0)


@functools.lru_cache(maxsize=1)
def _fp_grid() -> tuple[tuple[int, int, float], ...]:
    """(tenths of a bit per item, k, false-positive rate) for each filter size on the search grid, with
    the k of the lowest rate (the rest of a round's cost does not depend on k), computed once."""
    grid = []
    for tenths in range(20, 481, 5):  # 320 items in `tenths` words: tenths/10 bits per item
        rates = [(bloom_fp_rate(320, tenths, k), k) for k in range(1, _MAX_K + 1)]
        rate, k = min(rates)  # the smallest k among equal rates
        grid.append((tenths, k, rate))
    return tuple(grid)


def choose_index(
    n_items: int, expected_items: int, bytes_per_candidate: float, seed: int, kind: str = "auto",
    group: int = 1,
) -> IndexSpec:
    """The index layout that minimises index bytes + expected false-positive candidates' bytes, for
    ``expected_items`` candidates in entries of ``group`` items.

    ``kind`` forces "bitmap" or "bloom"; "auto" compares both.
    """
    bitmap = bitmap_spec(n_items, group)
    if kind == "bitmap":
        return bitmap
    if kind not in ("bloom", "auto"):
        raise ValueError(f"index must be 'auto', 'bitmap' or 'bloom', not {kind!r}")
    entries = bitmap.entries
    held = max(1, min(-(-expected_items // group), entries))
    outside = entries - held
    best: tuple[float, int, int] | None = None  # (cost, words, k); the spec is made once, for the best
    for tenths, k, rate in _fp_grid():
        words = max(1, math.ceil(held * tenths / 320))
        cost = 4 * words + rate * outside * group * bytes_per_candidate
        if best is None or cost < best[0]:
            best = (cost, words, k)
    assert best is not None
    if kind == "bloom" or best[0] < 4 * bitmap.words:
        return IndexSpec("bloom", n_items, best[1], best[2], seed, group)
    return bitmap


def expected_false_positives(spec: IndexSpec, items: int) -> float:
    """Expected candidates beyond the ``items`` true ones under ``spec`` (whole entries of them)."""
    if spec.kind == "bitmap":
        return 0.0
    held = -(-items // spec.group)
    return bloom_fp_rate(held, spec.words, spec.k) * max(0, spec.entries - held) * spec.group


#: Seeds the table of bit patterns, which is fixed: the per-bucket, per-round seed already decides which
#: word and which pattern each item takes. A table per seed cost an argsort of 131,072 keys on every call
#: (its cache never hit, since the seed changes with every call): 11% of a demo worker's agent thread.
_PATTERN_SEED = 0x5EED


@functools.lru_cache(maxsize=64)
def _patterns(k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(masks int32 [4096], bit positions int64 [4096, k]): 4096 random patterns of k distinct bits."""
    keys = mix32(torch.arange(_PATTERNS * 32, dtype=torch.int64, device=device).bitwise_xor_(_PATTERN_SEED))
    order = torch.argsort(keys.view(_PATTERNS, 32), dim=1, stable=True)[:, :k]
    masks = torch.bitwise_left_shift(1, order).sum(dim=1)
    masks = torch.where(masks >= 1 << 31, masks - (1 << 32), masks).to(torch.int32)
    return masks, order


def _bloom_slots(spec: IndexSpec, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(word, pattern number) of each item."""
    h = hash_items(items, spec.seed)
    pattern = torch.bitwise_and(h, _PATTERNS - 1)
    word = reduce_range(h, spec.words)
    return word, pattern


def bloom_masks(spec: IndexSpec, device: torch.device) -> torch.Tensor | None:
    """The Bloom filter's k-bit patterns as the GPU kernels take them (None for a bitmap)."""
    return _patterns(spec.k, device)[0] if spec.kind == "bloom" else None


def encode_index(spec: IndexSpec, items: torch.Tensor) -> torch.Tensor:
    """This worker's index words (int32) for its sorted, distinct item numbers."""
    if gpu.on_path():  # one kernel ORs every item's bit or pattern (an entry met twice ORs it again)
        masks = bloom_masks(spec, items.device)
        return gpu.encode_index(spec.kind, items, spec.group, spec.words, spec.seed & MASK32, masks)
    entries = group_entries(items, spec.group)
    if spec.kind == "bitmap":
        return words_from_positions(entries, spec.words)
    word, pattern = _bloom_slots(spec, entries)
    _, positions = _patterns(spec.k, items.device)
    flags = torch.zeros(spec.words * 32, dtype=torch.bool, device=items.device)
    flags[(word * 32).unsqueeze(1) + positions[pattern]] = True
    return pack_bits(flags)


def query_index(spec: IndexSpec, words: torch.Tensor) -> torch.Tensor:
    """Sorted candidate item numbers (int64) of an aggregated index: every item that may be held."""
    if gpu.on_path():
        return query_index_triton(spec, words)
    if spec.kind == "bitmap":
        entries = set_bits(words)
        # sorted: only a tail beyond the last entry (the last word's padding, set by no worker) can be wrong
        if entries.numel() and int(entries[-1]) >= spec.entries:
            entries = entries[entries < spec.entries]
    elif words.device.type == "cpu" and native is not None:
        entries = query_bloom_native(spec, words)
    else:
        entries = query_bloom_chunks(spec, words)
    return expand_groups(entries, spec.group, spec.n_items)


def query_index_triton(spec: IndexSpec, words: torch.Tensor) -> torch.Tensor:
    """:func:`query_index` on the GPU path: the bitmap's set bits counted per tile, or the Bloom filter's
    hit bits made and counted by one kernel; then their items, groups expanded (one kernel)."""
    if spec.kind == "bloom":
        masks = _patterns(spec.k, words.device)[0]
        seed = spec.seed & MASK32
        hits, counts = gpu.bloom_hits(words, spec.entries, seed, masks, spec.group, spec.n_items)
        return gpu.set_bit_items(hits, spec.entries, spec.group, spec.n_items, counts)
    return gpu.set_bit_items(words, spec.entries, spec.group, spec.n_items)


def query_bloom_native(spec: IndexSpec, words: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """The Bloom filter query by the compiled kernel (CPU only): a hit bit per entry, then its set bits.
    ``threads``: at most this many (default :func:`kernel_threads`); the result does not depend on it."""
    kernels = require_native()
    if words.dtype != torch.int32 or words.shape != (spec.words,) or words.device.type != "cpu":
        raise ValueError(f"the aggregated filter must be {spec.words} int32 CPU words, not {words.dtype}"
                         f" {tuple(words.shape)} on {words.device}")
    words = words.contiguous()
    masks, _ = _patterns(spec.k, words.device)
    hits = torch.empty((spec.entries + 31) // 32, dtype=torch.int32)
    kernels.bloom_hits(spec.entries, words.data_ptr(), spec.words, spec.seed & MASK32, masks.data_ptr(),
                      masks.numel(), hits.data_ptr(), kernel_threads() if threads is None else threads)
    return set_bits(hits)


def query_bloom_chunks(spec: IndexSpec, words: torch.Tensor) -> torch.Tensor:
    """The Bloom filter query in torch, in chunks of entries, on any device: the entries that may be held."""
    masks, _ = _patterns(spec.k, words.device)
    found = []
    for start in range(0, spec.entries, _QUERY_CHUNK):
        ids = torch.arange(start, min(start + _QUERY_CHUNK, spec.entries), device=words.device)
        word, pattern = _bloom_slots(spec, ids)
        mask = masks[pattern]
        hit = torch.bitwise_and(words[word], mask) == mask
        found.append(torch.nonzero(hit).squeeze(1).add_(start))
    if not found:
        return torch.zeros(0, dtype=torch.int64, device=words.device)
    return torch.cat(found)


__all__ = [
    "IndexSpec",
    "bitmap_spec",
    "bloom_fp_rate",
    "choose_index",
    "encode_index",
    "expected_false_positives",
    "query_index",
]
