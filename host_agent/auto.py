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
from lhc_ina.constants import LANES, MAX_WORKERS

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


def link_words(rank: int, link: LinkEstimate | None) -> torch.Tensor:
    """This worker's lanes of the link agreement: its RTT (µs) at ``rank``, its rate (kB/s) at
    ``MAX_WORKERS + rank``; zeros where it has measured nothing yet."""
    words = torch.zeros(LANES, dtype=torch.int32)
    if link is not None:
        words[rank] = min(int(link.rtt_s * 1e6) + 1, 2**26)
        words[MAX_WORKERS + rank] = min(int(link.bytes_per_s / 1e3) + 1, 2**26)
    return words


def agreed_link(words: torch.Tensor, world_size: int) -> LinkEstimate | None:
    """The workers' mean link estimate from the summed lanes of :func:`link_words`."""
    rtts = [int(v) for v in words[:world_size] if v > 0]
    rates = [int(v) for v in words[MAX_WORKERS : MAX_WORKERS + world_size] if v > 0]
    if not rtts or not rates:
        return None
    return LinkEstimate(sum(rtts) / len(rtts) / 1e6, sum(rates) / len(rates) * 1e3)
