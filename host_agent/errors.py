"""The one exception type an aggregation raises, on every worker, whatever part detected the problem."""

from __future__ import annotations


class AggregationError(RuntimeError):
    """An aggregation that cannot return an exact result: workers that disagree, a worker gone silent, a
    job the controller failed, a peeling or overflow problem. ``ranks`` names the workers involved (empty
    when none can be named); the message says what happened."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(sorted(ranks))
