"""Which path each call (bucket) takes: the switch, or the hosts' process-group codec.

Both paths give the same bits (``host_agent.paths``), so the choice is only about time, and about which
path is up. A policy reads facts every rank holds alike (:class:`CallFacts`) and, where it must measure,
agrees its measurements with the other ranks over the hosts (one ADD), so that every rank picks the same
path for every call.

- :class:`SwitchWhileHealthy` (the default): every call through the switch while its path is usable.
- :class:`FastestPath` (``path="fastest"``, ``LHC_PATH=fastest``): each bucket over the path that was
  faster for it. A bucket's first call goes through the switch (mode ``auto`` measures its density
  there); its next ``2 * trials`` calls (4 by default) alternate switch and hosts, each rank timing them
  and keeping its fastest call of each path (one slow call, a step that met a busy core or a path's first
  large collective, then decides nothing); at the next call the ranks add those (microseconds, one ADD of
  three words: a rank that could not time both paths keeps the bucket on the switch) and the bucket
  keeps the path with the smaller sum from then on. Dense buckets, which the switch moves as 272-byte
  packets where Gloo moves full frames, are where the hosts can win; a bucket whose last trial went
  dense (mode ``dense``, or a sparse mode that found the bucket cheaper whole) keeps the switch only
  when the switch's sum is at least :data:`DENSE_SWITCH_MARGIN` below the hosts'.
  Near a tie the trials cannot tell the paths apart (a path's fastest of two calls moves by several
  percent from run to run), the hosts' path is DDP's own ring, and the switch's aggregation slots, which
  every tenant shares, are better left to a bucket the switch compresses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import torch

SWITCH, HOST = "switch", "host"
#: The path policies by the name a launch line gives them (``path=`` / ``LHC_PATH``).
PATH_CHOICES = ("switch", "fastest")
#: Calls of each path a bucket is timed over before :class:`FastestPath` settles it (its fastest counts).
DEFAULT_TRIALS = 2
#: The share of the hosts' time a dense bucket's switch trials must save for the switch to keep it.
DENSE_SWITCH_MARGIN = 0.10

#: Sums int32 words over every rank through the hosts, within the meeting deadline; the string says what
#: the sum is for, in the error of a rank that does not come.
HostSum = Callable[[torch.Tensor, str], torch.Tensor]


@dataclass(frozen=True)
class CallFacts:
    """What a policy may read to choose a call's path: facts every rank holds alike."""

    number: int  # the call's number, the same on every rank
    key: Hashable  # the bucket's key
    elements: int  # the bucket's length
    switch_usable: bool  # the switch path is in use: not failed since the last agreed return


class PathPolicy(Protocol):
    """Chooses each call's path from agreed facts only, so that every rank chooses alike."""

    def choose(self, facts: CallFacts, host_sum: HostSum) -> str:
        """:data:`SWITCH` or :data:`HOST` (the switch only where ``facts.switch_usable``). ``host_sum``
        agrees a measurement with the other ranks; a policy calls it at the same calls on every rank."""
        ...

    def observe(self, facts: CallFacts, path: str, seconds: float, protocol: str) -> None:
        """Call ``facts.number`` completed on ``path`` in ``seconds`` on this rank; ``protocol``: how the
        codec sent it (``Backend.end_call``, the same on every rank)."""
        ...


class SwitchWhileHealthy:
    """The default: every call through the switch while its path is usable, over the hosts otherwise."""

    def choose(self, facts: CallFacts, host_sum: HostSum) -> str:
        return SWITCH if facts.switch_usable else HOST

    def observe(self, facts: CallFacts, path: str, seconds: float, protocol: str) -> None:
        """Nothing to learn: the choice does not depend on time."""


class FastestPath:
    """Each bucket over the path measured faster for it (see the module docstring)."""

    def __init__(self, world_size: int, trials: int = DEFAULT_TRIALS) -> None:
        if trials < 1:
            raise ValueError(f"trials must be at least 1, not {trials}")
        self.trials = trials
        #: A rank's timing in microseconds is capped so that the sum over ``world_size`` ranks fits int32.
        self.cap_us = (2**31 - 1) // world_size
        self.settled: dict[Hashable, str] = {}  # bucket key -> its path, once measured
        self.reasons: dict[Hashable, str] = {}
        self._seen: dict[Hashable, int] = {}  # calls of each bucket chosen so far (trials included)
        self._trial_of: dict[int, str] = {}  # call number -> the path it was a trial of
        self._best_us: dict[Hashable, list[int]] = {}  # bucket key -> [switch, host]: fastest trial here
        self._dense: dict[Hashable, bool] = {}  # bucket key -> whether its last trial was dense

    def choose(self, facts: CallFacts, host_sum: HostSum) -> str:
        if not facts.switch_usable:
            return HOST
        if facts.key in self.settled:
            return self.settled[facts.key]
        seen = self._seen.get(facts.key, 0)
        if seen <= 2 * self.trials:  # the warm-up call (0), then the trials, switch first
            self._seen[facts.key] = seen + 1
            path = SWITCH if seen % 2 == 1 or seen == 0 else HOST
            if seen > 0:
                self._trial_of[facts.number] = path
            return path
        return self._settle(facts.key, host_sum)

    def observe(self, facts: CallFacts, path: str, seconds: float, protocol: str) -> None:
        if self._trial_of.pop(facts.number, None) != path:  # not a trial, or moved by a fallback
            return
        self._dense[facts.key] = protocol == "dense"
        best = self._best_us.setdefault(facts.key, [0, 0])  # 0: not timed yet
        index = 0 if path == SWITCH else 1
        took = max(1, min(self.cap_us, int(seconds * 1e6)))
        best[index] = took if best[index] == 0 else min(best[index], took)

    def _settle(self, key: Hashable, host_sum: HostSum) -> str:
        best = self._best_us.pop(key, [0, 0])
        untimed = int(0 in best)  # a trial moved by a fallback: this rank cannot compare the paths
        mine = torch.tensor([*best, untimed], dtype=torch.int32)
        summed = host_sum(mine, f"the path trials of bucket {key!r}")
        switch_us, host_us, ranks_untimed = (int(v) for v in summed)
        margin = DENSE_SWITCH_MARGIN if self._dense.pop(key, False) else 0.0
        path = SWITCH if ranks_untimed or switch_us <= host_us * (1 - margin) else HOST
        self.settled[key] = path
        rule = f" (dense: the switch keeps it {margin:.0%} faster or more)" if margin else ""
        self.reasons[key] = (f"the fastest of {self.trials} calls each, summed over the ranks: switch "
                             f"{switch_us / 1e3:.1f} ms, hosts {host_us / 1e3:.1f} ms{rule}")
        return path


def make_policy(name: str, world_size: int) -> SwitchWhileHealthy | FastestPath:
    """The policy a launch line names (:data:`PATH_CHOICES`); ``LHC_PATH_TRIALS`` sets how many calls of
    each path :class:`FastestPath` times (default :data:`DEFAULT_TRIALS`)."""
    if name == "switch":
        return SwitchWhileHealthy()
    if name == "fastest":
        text = os.environ.get("LHC_PATH_TRIALS", str(DEFAULT_TRIALS))
        try:
            trials = int(text)
        except ValueError:
            raise ValueError(f"LHC_PATH_TRIALS must be an integer, not {text!r}") from None
        return FastestPath(world_size, trials)
    raise ValueError(f"path must be one of {PATH_CHOICES}, not {name!r}")
