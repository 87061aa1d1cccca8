"""What a session hands out: its messages, its result, and the state a bucket's next aggregation uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lhc_ina.constants import Op


@dataclass(frozen=True)
class Message:
    """One step: ``words`` (1-D int32) to be reduced across all workers with ``op``."""

    op: Op
    words: torch.Tensor
    round: int
    kind: str  # what the words are: agree, header, index, sketch, values, residue, dense
    #: The words are this message's alone, no view of the bucket or its output: a backend may reduce them
    #: in place (the process group's long ADDs, which then need no copy).
    scratch: bool = False


@dataclass(frozen=True)
class BucketShape:
    """What a state is only valid for: the bucket's length and dtype and the codec's block. Not the mode:
    what a state holds (the union's size, the agreed exponent) means the same in every mode, and every
    mode quantizes by one scale rule, so the host agent's ``auto`` may switch modes without starting over."""

    length: int
    dtype: str
    block: int

    def __str__(self) -> str:
        return f"{self.length} {self.dtype} elements, block {self.block}"


@dataclass(frozen=True)
class CodecState:
    """What a bucket's next aggregation learns from this one. Identical on every worker, because it is
    derived only from aggregated data; pass it to the next aggregation of the same bucket. A state that
    records another bucket's shape is not used (the session starts fresh and says so in its stats)."""

    iteration: int = 0
    items: int | None = None  # union items of the last round (estimate when not measured); None: unknown
    exponent: int | None = None  # agreed float32 exponent field of the last round's max |x|
    shape: BucketShape | None = None  # None only in a fresh state
    group: int = 1  # items per index entry for the next round (granularity.py); `items` counts them whole

    def as_dict(self) -> dict:
        """Plain values (for checkpoints: ``torch.save`` and JSON alike)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> CodecState:
        shape = fields.get("shape")
        return cls(fields["iteration"], fields["items"], fields["exponent"],
                   None if shape is None else BucketShape(**shape), fields.get("group", 1))

    def mismatch(self, shape: BucketShape) -> str | None:
        """Why this state cannot be used for a bucket of ``shape``, or None if it can."""
        if self.shape is None or self.shape == shape:
            return None
        return f"the state was made for {self.shape}, not for {shape}"


@dataclass
class WorkerResult:
    total: torch.Tensor
    stats: dict
    state: CodecState

    def __iter__(self) -> Iterator:
        return iter((self.total, self.stats, self.state))
