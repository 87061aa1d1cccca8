"""The switch's aggregator slots as a free list of ranges: first fit, coalescing on release.

The store rebuilds a pool from the ranges its jobs hold (inside the admission transaction), so the free
list is never a second source of truth that could drift from the jobs, and a crash cannot leak a range.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SlotRange:
    base: int
    count: int

    @property
    def end(self) -> int:
        return self.base + self.count


class SlotPoolError(ValueError):
    """A range that cannot be allocated or released (the message says why)."""


class SlotPool:
    """Free ranges of ``[0, size)``, sorted and coalesced (no two free ranges touch)."""

    def __init__(self, size: int, allocated: list[SlotRange] | tuple[SlotRange, ...] = ()) -> None:
        self.size = size
        self.free: list[SlotRange] = [SlotRange(0, size)] if size else []
        for taken in sorted(allocated):
            self.take(taken)

    @property
    def free_slots(self) -> int:
        return sum(r.count for r in self.free)

    @property
    def largest_free(self) -> int:
        return max((r.count for r in self.free), default=0)

    def allocate(self, count: int) -> SlotRange:
        """The lowest free range of ``count`` slots (first fit), removed from the free list."""
        if count <= 0:
            raise SlotPoolError(f"a job needs at least 1 slot, not {count}")
        for hole in self.free:
            if hole.count >= count:
                chosen = SlotRange(hole.base, count)
                self.take(chosen)
                return chosen
        raise SlotPoolError(
            f"no {count} consecutive free slots: {self.free_slots} of {self.size} free, the largest free "
            f"range has {self.largest_free}"
        )

    def take(self, wanted: SlotRange) -> None:
        """Remove ``wanted`` from the free list; it must lie inside one free range."""
        for i, hole in enumerate(self.free):
            if hole.base <= wanted.base and wanted.end <= hole.end:
                rest = [
                    SlotRange(hole.base, wanted.base - hole.base),
                    SlotRange(wanted.end, hole.end - wanted.end),
                ]
                self.free[i : i + 1] = [r for r in rest if r.count > 0]
                return
        raise SlotPoolError(f"slots {wanted.base}..{wanted.end - 1} are not free")

    def release(self, freed: SlotRange) -> None:
        """Return ``freed`` to the free list, merging it with the free ranges it touches."""
        if freed.base < 0 or freed.end > self.size or freed.count <= 0:
            raise SlotPoolError(f"slots {freed.base}..{freed.end - 1} are outside 0..{self.size - 1}")
        for hole in self.free:
            if hole.base < freed.end and freed.base < hole.end:
                raise SlotPoolError(f"slots {freed.base}..{freed.end - 1} overlap free slots {hole.base}..")
        merged = sorted([*self.free, freed])
        self.free = []
        for r in merged:
            if self.free and self.free[-1].end == r.base:
                last = self.free.pop()
                r = SlotRange(last.base, last.count + r.count)
            self.free.append(r)
