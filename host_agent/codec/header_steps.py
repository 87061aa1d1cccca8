"""How the states read and write the header, the words every aggregation's first round carries beside the
agreement: this worker's header (its exponent field, or whether its integers are in bound, and whether it
is finite), the OR of every worker's read back, and the one scale rule every mode follows once the agreed
exponent is known. Mixed into ``protocol.Rounds``, whose state it reads and sets (``scale``, ``agreed``,
``assumed``, ``nonfinite``...).
"""

from __future__ import annotations

import torch

from . import gpu
from .agreement import check_agreement
from .quantize import (
    HEADER_WORDS,
    MAX_FIELD,
    exponent_field,
    header_words,
    int_in_bound,
    nonfinite_ranks,
    parse_header,
    scale_for,
    scale_holds,
)


class HeaderSteps:
    """The header's and the scale's part of ``protocol.Rounds`` (see the module docstring)."""

    def agreement(self, words: torch.Tensor) -> None:
        """Check the summed agreement message (cheap: called as soon as it arrives). A CUDA aggregate (from
        NCCL) is read back through a pinned buffer, not by a pageable copy."""
        host = words if words.device.type == "cpu" else gpu.read_back(words)
        with gpu.on_host():
            self.item_sum = check_agreement(host, self.world)

    def _header(self, values: torch.Tensor, support_complete: bool = True) -> torch.Tensor:
        field, finite, in_bound = None, True, True
        if self.is_float:
            field, finite = exponent_field(values)
        else:
            in_bound = int_in_bound(values, self.world)
        return self._header_of(field, finite, in_bound, support_complete)

    def _header_of(self, field: int | None, finite: bool, in_bound: bool, support_complete: bool = True
                   ) -> torch.Tensor:
        """This worker's header, on the host (it leaves with the agreement: :meth:`_send_lead`)."""
        self.finite = finite
        with gpu.on_host():
            return header_words(field, self.rank, finite=finite, in_bound=in_bound,
                                support_complete=support_complete, device=torch.device("cpu"))

    def _assumed_field(self) -> int | None:
        if not self.is_float or self.state.exponent is None:
            return None
        return min(self.state.exponent + self.opts.headroom, MAX_FIELD)

    def _settle_scale(self) -> None:
        """The one rule every mode follows once the agreed exponent is known: the assumed scale when it
        held, else the agreed one (and the assumption is dropped). So modes quantize a bucket identically,
        given the same state, and the host agent's ``auto`` may switch modes without changing a bit."""
        if self.assumed is not None and not scale_holds(self.agreed, self.assumed, self.lag):
            self.assumed = None
        self.scale = scale_for(self.agreed if self.assumed is None else self.assumed, self.world)

    def _parse_header(self, kind: str) -> bool:
        """Read the OR of the headers, the first words of the ``kind`` message's aggregate; True when some
        worker's input was not finite (the caller then ends the aggregation with
        :meth:`_nonfinite_outcome`). Read from the aggregate as it was received: a transport delivers it
        on the host, where reading costs no device operation; else it is read back."""
        with self.clock("decode"):
            words = self.received[kind][:HEADER_WORDS]
            host = words if words.device.type == "cpu" else gpu.read_back(words)
            with gpu.on_host():
                self.nonfinite = nonfinite_ranks(host, self.world)
                self.agreed = parse_header(host, self.world)
        return bool(self.nonfinite)
