"""Joining a job with the hosts as the way out: a job the switch cannot serve does not stop the run.

Every rank tries to join the job on the controller (within ``join_timeout_s``), then the ranks tell each
other over the process group whether they could (one ADD of a lane per rank). When all joined and the job
is installed, the run aggregates through the switch, with the process-group codec ready for a fallback
(``host_agent.paths``). When any rank could not (the controller refused the job: unknown, no free slots;
it did not answer within the deadline; the job's switch is down so its entries never got installed), every
rank aggregates over the process group with the same codec, which gives the same bits, and says so once,
in a warning that names the cause. ``strict`` (``LHC_STRICT=1``) makes that an error instead, and turns
off the fallback mid-job as well: the run then stops with the switch, as it did before the path layer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from host_agent.agent_backend import Backend
from host_agent.path_policy import PathPolicy
from host_agent.paths import DEFAULT_MEET_TIMEOUT_S, PathBackend
from lhc_ina.constants import Op
from lhc_ina.jobservice.errors import ControllerError

log = logging.getLogger("lhc.paths")

STRICT = "LHC_STRICT"
#: How long a rank tries to join and see its job installed before the run goes over the hosts.
DEFAULT_JOIN_TIMEOUT_S = 30.0


def deadlines_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, float]:
    """The deadlines a launch line may set, by their argument names: ``LHC_JOIN_TIMEOUT_S``,
    ``LHC_SWITCH_TIMEOUT_S`` (how long a packet may go unanswered before the switch path is declared
    failed) and ``LHC_MEET_TIMEOUT_S``; only those set."""
    names = {"join_timeout_s": "LHC_JOIN_TIMEOUT_S", "timeout_s": "LHC_SWITCH_TIMEOUT_S",
             "meet_timeout_s": "LHC_MEET_TIMEOUT_S"}
    return {name: float(environ[variable]) for name, variable in names.items() if environ.get(variable)}


def strict_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``LHC_STRICT``: unset, empty or 0 means the fallback is on (the default)."""
    return environ.get(STRICT, "0") not in ("", "0")


def join_or_fall_back(controller: str, job: str, group: Backend, *,
                      join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
                      meet_timeout_s: float = DEFAULT_MEET_TIMEOUT_S, policy: PathPolicy | None = None,
                      **switch_options: Any) -> PathBackend:
    """The job's switch path with ``group`` (a ``ProcessGroupBackend``) as the fallback, or ``group`` alone
    when any rank cannot use the switch; every rank gets the same answer. ``switch_options`` go to
    :meth:`host_agent.transport.switch.SwitchBackend.join`."""
    from host_agent.transport.switch import SwitchBackend

    switch, why = None, ""
    try:
        options = {"world_size": group.world_size, "install_timeout_s": join_timeout_s, **switch_options}
        switch = SwitchBackend.join(controller, job, **options)
    except ControllerError as exc:
        why = f"the controller at {controller}: {exc}"
    except OSError as exc:  # the worker's own socket
        why = f"no data-plane socket: {exc}"
    lanes = torch.zeros(group.world_size, dtype=torch.int32)
    lanes[group.rank] = 1 if switch is not None else 0
    try:
        joined = group.reduce(Op.ADD, lanes).result(timeout=join_timeout_s + meet_timeout_s).tolist()
    except Exception:
        if switch is not None:
            switch.close()
        raise
    refused = [rank for rank, flag in enumerate(joined) if flag != 1]
    if not refused:
        return PathBackend(group, switch, policy=policy, meet_timeout_s=meet_timeout_s)
    if switch is not None:
        switch.close()  # leaves the job: it cannot fill
    why = why or f"rank(s) {refused} could not join it"
    log.warning("lhc: rank %d: job %r cannot be used through the switch (%s); every rank aggregates over the "
                "process group instead, with the same codec and the same bits (set %s=1 to stop instead)",
                group.rank, job, why, STRICT)
    return PathBackend(group, None, meet_timeout_s=meet_timeout_s, why_host=why)

