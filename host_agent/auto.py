"""Mode ``auto``: dense, sketch or union per bucket, from what every worker agrees on.

Every worker must pick the same mode, so the choice reads only agreed facts: the bucket's size, W, the
union size the bucket's last aggregation found (its ``CodecState``) and a link estimate the workers
averaged over the network (``agree_link``). It prices each mode as bytes over the measured rate, plus
its round trips, plus its decode work, and takes the cheapest:

- ``dense``: 4 bytes per element, one round trip, no decode;
- ``sketch``: the index plus about 1.23 cells per candidate, one round trip, peeling;
- ``union``: the index plus one value per candidate, two round trips, no peeling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from host_agent.agent_backend import LinkEstimate
from host_agent.codec import CodecState
from host_agent.codec.index import choose_index, expected_false_positives
from host_agent.codec.items import item_count
from host_agent.codec.sketch import DEFAULT_MARGIN, sketch_cells
from lhc_ina.constants import LANES, MAX_JOB_WORKERS

#: Until the workers have measured their link: a loopback softswitch's order of magnitude.
DEFAULT_LINK = LinkEstimate(rtt_s=2e-3, bytes_per_s=5e6)
#: Calls between two link agreements (a one-packet round trip each).
LINK_AGREE_EVERY = 16
#: Decode work per candidate, measured with the compiled kernels (docs/codec.md): peeling visits a
#: candidate's three cells; union only scatters.
SKETCH_DECODE_S_PER_CANDIDATE = 1e-7
UNION_DECODE_S_PER_CANDIDATE = 2e-8


@dataclass(frozen=True)
class ModeChoice:
    mode: str
    reason: str
    estimates_s: dict[str, float]


def choose_mode(n: int, world_size: int, block: int, state: CodecState | None,
                link: LinkEstimate | None, layout: str = "fused") -> ModeChoice:
    """The cheapest mode for a bucket of ``n`` elements (see the module docstring); ``layout``: the
    sketch's, resolved (``sketch.resolve_layout``)."""
    if state is None or state.items is None:
        return ModeChoice("sketch", "no density known for this bucket yet: sketch measures it", {})
    link = link or DEFAULT_LINK
    n_items = item_count(n, block)
    items = max(1, min(state.items, n_items))
    spec = choose_index(n_items, items, 4.0 * block, seed=0, group=state.group)
    candidates = items + expected_false_positives(spec, items)
    cells = sketch_cells(candidates, DEFAULT_MARGIN, block, LANES, layout)
    sizes = {
        "dense": 4.0 * n,
        "sketch": 4.0 * (spec.words + cells * block),
        "union": 4.0 * (spec.words + candidates * block),
    }
    trips = {"dense": 1, "sketch": 1, "union": 2}
    decode = {
        "dense": 0.0,
        "sketch": SKETCH_DECODE_S_PER_CANDIDATE * candidates,
        "union": UNION_DECODE_S_PER_CANDIDATE * candidates,
    }
    estimates = {
        mode: sizes[mode] / link.bytes_per_s + trips[mode] * link.rtt_s + decode[mode] for mode in sizes
    }
    mode = min(estimates, key=estimates.__getitem__)
    reason = (
        f"union density {items / n_items:.4f} of {n_items} items, W={world_size}, rtt "
        f"{link.rtt_s * 1e3:.2f} ms, {link.bytes_per_s / 1e6:.1f} MB/s: "
        + ", ".join(f"{m} {t * 1e3:.2f} ms" for m, t in estimates.items())
    )
    return ModeChoice(mode, reason, estimates)


#: Lanes of the link agreement (ADD): how many workers measured, then the sums of their RTTs (µs) and rates
#: (kB/s), each split into its low 16 bits and the rest so that no sum of MAX_JOB_WORKERS of them carries
#: out of 32 bits (each value is capped at 2^26: the high parts sum to at most 1024 * 2^10).
_MEASURED, _RTT_LOW, _RTT_HIGH, _RATE_LOW, _RATE_HIGH = range(5)
_LINK_CAP = 2**26
assert MAX_JOB_WORKERS * (_LINK_CAP >> 16) < 2**31 and MAX_JOB_WORKERS * 0xFFFF < 2**31


def link_words(link: LinkEstimate | None) -> torch.Tensor:
    """This worker's lanes of the link agreement: a count of 1 and its RTT (µs) and rate (kB/s) in sums
    that any number of workers up to MAX_JOB_WORKERS share (no lane per rank); zeros where it has
    measured nothing yet."""
    words = torch.zeros(LANES, dtype=torch.int32)
    if link is not None:
        rtt = min(int(link.rtt_s * 1e6) + 1, _LINK_CAP)
        rate = min(int(link.bytes_per_s / 1e3) + 1, _LINK_CAP)
        values = {_MEASURED: 1, _RTT_LOW: rtt & 0xFFFF, _RTT_HIGH: rtt >> 16, _RATE_LOW: rate & 0xFFFF,
                  _RATE_HIGH: rate >> 16}
        for lane, value in values.items():
            words[lane] = value
    return words


def agreed_link(words: torch.Tensor, world_size: int) -> LinkEstimate | None:
    """The mean link estimate of the workers that measured one, from the summed lanes of
    :func:`link_words`; None if none did (``world_size`` bounds the count: more is a corrupt sum)."""
    sums = [int(v) for v in words[:5]]
    measured = sums[_MEASURED]
    if not 0 < measured <= world_size:
        return None
    rtt_us = sums[_RTT_LOW] + (sums[_RTT_HIGH] << 16)
    rate_kb = sums[_RATE_LOW] + (sums[_RATE_HIGH] << 16)
    return LinkEstimate(rtt_us / measured / 1e6, rate_kb / measured * 1e3)
