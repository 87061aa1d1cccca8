"""The one exception type an aggregation raises, on every worker, whatever part detected the problem."""

from __future__ import annotations


class AggregationError(RuntimeError):
    """An aggregation that cannot return an exact result: workers that disagree, a worker gone silent, a
    job the controller failed, a peeling or overflow problem. A NaN or inf in an input is none of these:
    every worker gets a non-finite total back, as from a float allreduce (``host_agent.codec.protocol``).
    ``ranks`` names the workers involved (empty when none can be named); the message says what happened.

    ``collective`` marks an error every worker raises at the same point of the protocol, decided from
    aggregated words alone (an integer overflow, a float sum beyond its dtype): the workers' streams still
    line up, so the next call may proceed. Any other error leaves this worker out of step with its peers:
    its agent is failed from then on (``host_agent.agent``)."""

    def __init__(self, message: str, ranks: tuple[int, ...] = (), *, collective: bool = False) -> None:
        super().__init__(message)
        self.ranks = tuple(sorted(ranks))
        self.collective = collective
