"""Fresh epochs: 16 bits, never 0, and never one a slot of the new range may still hold.

A slot copy resets lazily when a packet's epoch differs from the one it stores (docs/switch.md), so a job
given an epoch that some of its slots still carry from an earlier job would inherit that job's partial
rounds. A slot copy keeps the epoch of the last job that *sent to it*, which may be any earlier job whose
range covered it, not only the latest. The store therefore keeps every (range, epoch) it gave out
("marks") until the switch's registers are known to be reset (it came back without a pipeline), and a
new epoch skips every epoch marked on an overlapping range and every epoch a live job holds.
"""

from __future__ import annotations

from controller.slots import SlotRange

#: Epochs are 16-bit; 0 is the registers' reset value and never given.
EPOCH_LIMIT = 1 << 16


class EpochsExhausted(RuntimeError):
    """All 65535 epochs were given to jobs on these slots since the switch's registers were last reset."""


def next_epoch(
    start: int, ranges: list[SlotRange], marks: list[tuple[SlotRange, int]], live: set[int]
) -> int:
    """The first epoch from ``start`` on (1..65535, wrapping) that no slot of ``ranges`` holds and no live
    job uses."""
    taken = set(live) | overlapping(marks, ranges)
    candidate = start if 0 < start < EPOCH_LIMIT else 1
    for _ in range(EPOCH_LIMIT):
        if candidate not in taken:
            return candidate
        candidate = candidate % (EPOCH_LIMIT - 1) + 1
    raise EpochsExhausted(
        f"every epoch may still be held by slots {', '.join(f'{r.base}..{r.end - 1}' for r in ranges)}; "
        "restart the switch (fresh registers) to free them"
    )


def overlapping(marks: list[tuple[SlotRange, int]], ranges: list[SlotRange]) -> set[int]:
    """The epochs some slot of ``ranges`` may hold."""
    return {epoch for mark, epoch in marks if any(mark.base < r.end and r.base < mark.end for r in ranges)}
