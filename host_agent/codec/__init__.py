"""Lossless homomorphic compression for in-network aggregation (docs/architecture.md §1).

Each worker marks its nonzero items in an OR-aggregated index (exact bitmap or blocked Bloom filter)
and adds its quantized values into an ADD-aggregated partitioned Count Sketch (``sketch`` mode), or sends
them densely over the agreed candidates (``union`` mode), or sends the whole bucket (``dense``). Every
worker decodes the same aggregate by parallel peeling; what peeling cannot recover is sent once more,
exactly. The result is the sum of the workers' integers, bit for bit; floats are quantized with one
agreed power-of-two scale (error bound in :mod:`.quantize`). Every aggregation starts with an agreement
message, so workers whose parameters differ fail together (:mod:`.agreement`).

Public API: :func:`aggregate_local` (in-process, for users, tests and benchmarks) and
:class:`WorkerSession` (one worker, driven by a transport); every failure the workers agree on is an
:class:`AggregationError`.
"""

from host_agent.errors import AggregationError

from .local import AggregateResult, aggregate_local, reduce_words
from .options import MODES, Options
from .quantize import SCALE_SLACK, int_bound
from .session import WorkerSession
from .sketch import DEFAULT_MARGIN, PEEL_THRESHOLD
from .state import BucketShape, CodecState, Message, WorkerResult

__all__ = [
    "DEFAULT_MARGIN",
    "MODES",
    "PEEL_THRESHOLD",
    "SCALE_SLACK",
    "AggregateResult",
    "AggregationError",
    "BucketShape",
    "CodecState",
    "Message",
    "Options",
    "WorkerResult",
    "WorkerSession",
    "aggregate_local",
    "int_bound",
    "reduce_words",
]
