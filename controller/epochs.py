"""Fresh epochs: 16 bits, never 0, and never one a slot of the new range may still hold.

A slot copy resets lazily when a packet's epoch differs from the one it stores (docs/switch.md), so a job
given an epoch that some of its slots still carry from an earlier job would inherit that job's partial
rounds. The store therefore remembers, per slot range, the epoch it was last given ("marks"), and a new
epoch skips every epoch marked on the range it is for, and every epoch a live job holds.
"""

from __future__ import annotations

from controller.slots import SlotRange

#: Epochs are 16-bit; 0 is the registers' reset value and never given.
EPOCH_LIMIT = 1 << 16


def next_epoch(
    start: int, ranges: list[SlotRange], marks: list[tuple[SlotRange, int]], live: set[int]
) -> int:
    """The first epoch from ``start`` on (1..65535, wrapping) that no slot of ``ranges`` holds and no live
    job uses."""
    taken = set(live)
    for mark, epoch in marks:
        if any(mark.base < r.end and r.base < mark.end for r in ranges):
            taken.add(epoch)
    candidate = start if 0 < start < EPOCH_LIMIT else 1
    for _ in range(EPOCH_LIMIT):
        if candidate not in taken:
            return candidate
        candidate = candidate % (EPOCH_LIMIT - 1) + 1
    raise RuntimeError("every epoch is taken on these slots")  # needs > 65535 marks: cannot happen


def set_marks(
    marks: list[tuple[SlotRange, int]], ranges: list[SlotRange], epoch: int
) -> list[tuple[SlotRange, int]]:
    """``marks`` with ``ranges`` now carrying ``epoch`` (older marks cut where they overlap)."""
    result: list[tuple[SlotRange, int]] = []
    for mark, old in marks:
        pieces = [mark]
        for r in ranges:
            cut = []
            for p in pieces:
                if p.base < r.end and r.base < p.end:
                    cut += [SlotRange(p.base, r.base - p.base), SlotRange(r.end, p.end - r.end)]
                else:
                    cut.append(p)
            pieces = [p for p in cut if p.count > 0]
        result += [(p, old) for p in pieces]
    result += [(r, epoch) for r in ranges]
    return sorted(result)
