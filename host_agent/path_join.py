"""Joining a job with the hosts as the way out: a job the switch cannot serve does not stop the run.

Every rank tries to join the job on the controller and see it installed (within ``join_timeout_s``), then
the ranks tell each other over the process group whether they could (one ADD of a lane per rank). When
all could, the run aggregates through the switch, with the process-group codec ready for a fallback
(``host_agent.paths``). When any rank could not (the controller refused the job: unknown, no free slots;
it did not answer within the deadline; the job's switch is down so its entries never got installed), every
rank aggregates over the process group with the same codec, which gives the same bits, and says so once,
in a warning that names the cause. A rank that joined keeps its membership (so that the job, installed
later, can take the run back), and every ``rejoin_every_s`` the ranks try to join again where they hold
none (``LHC_REJOIN_EVERY_S``; ``host_agent.paths``, "Joining again"). ``strict`` (``LHC_STRICT=1``)
makes the fallback an error instead, and turns off the fallback mid-job as well: the run then stops with
the switch, as it did before the path layer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from host_agent.agent_backend import Backend
from host_agent.path_policy import PathPolicy
from host_agent.paths import DEFAULT_MEET_TIMEOUT_S, DEFAULT_REJOIN_EVERY_S, PathBackend
from lhc_ina.constants import Op
from lhc_ina.jobservice.errors import ControllerError

log = logging.getLogger("lhc.paths")

STRICT = "LHC_STRICT"
#: How long a rank tries to join and see its job installed before the run goes over the hosts.
DEFAULT_JOIN_TIMEOUT_S = 30.0
#: The shortest deadline a JoinJob gets (the controller's answer to the join that completes a job waits up
#: to 5 s for the switch's entries; a join cut short would leave a member without a worker), and the one
#: a join tried again while on the hosts gets: it holds a step that long at most.
REJOIN_RPC_S = 8.0


def deadlines_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, float]:
    """The deadlines a launch line may set, by their argument names: ``LHC_JOIN_TIMEOUT_S``,
    ``LHC_SWITCH_TIMEOUT_S`` (how long a packet may go unanswered before the switch path is declared
    failed), ``LHC_MEET_TIMEOUT_S`` and ``LHC_REJOIN_EVERY_S``; only those set."""
    names = {"join_timeout_s": "LHC_JOIN_TIMEOUT_S", "timeout_s": "LHC_SWITCH_TIMEOUT_S",
             "meet_timeout_s": "LHC_MEET_TIMEOUT_S", "rejoin_every_s": "LHC_REJOIN_EVERY_S"}
    return {name: float(environ[variable]) for name, variable in names.items() if environ.get(variable)}


def strict_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``LHC_STRICT``: unset, empty or 0 means the fallback is on (the default)."""
    return environ.get(STRICT, "0") not in ("", "0")


def join_or_fall_back(controller: str, job: str, group: Backend, *,
                      join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
                      meet_timeout_s: float = DEFAULT_MEET_TIMEOUT_S, policy: PathPolicy | None = None,
                      rejoin_every_s: float = DEFAULT_REJOIN_EVERY_S, **switch_options: Any) -> PathBackend:
    """The job's switch path with ``group`` (a ``ProcessGroupBackend``) as the fallback, or ``group`` alone
    until every rank can use the switch; every rank gets the same answer. ``switch_options`` go to
    :meth:`host_agent.transport.switch.SwitchBackend.enrol`."""
    from host_agent.transport.switch import SwitchBackend

    options = {"world_size": group.world_size, **switch_options}
    rpc_timeout_s = max(min(30.0, join_timeout_s), REJOIN_RPC_S)  # see REJOIN_RPC_S
    member, why = _enrol(controller, job, rpc_timeout_s=rpc_timeout_s, **options)
    if member is not None:
        try:
            member.wait_installed(join_timeout_s)
        except ControllerError as exc:
            why = f"the controller at {controller}: {exc}"
    lanes = torch.zeros(group.world_size, dtype=torch.int32)
    lanes[group.rank] = 1 if member is not None and member.stream is not None else 0
    try:
        joined = group.reduce(Op.ADD, lanes).result(timeout=join_timeout_s + meet_timeout_s).tolist()
    except Exception:
        if member is not None:
            member.close()
        raise

    def rejoin() -> SwitchBackend | None:
        try:
            again, why_not = _enrol(controller, job, rpc_timeout_s=REJOIN_RPC_S, **options)
        except ValueError as exc:  # the job now has another size: another run's
            again, why_not = None, str(exc)
        if again is None:
            log.info("lhc: rank %d: joining job %r again failed (%s); still over the process group",
                     group.rank, job, why_not)
        return again

    refused = [rank for rank, flag in enumerate(joined) if flag != 1]
    if not refused:
        return PathBackend(group, member, policy=policy, meet_timeout_s=meet_timeout_s, rejoin=rejoin,
                           rejoin_every_s=rejoin_every_s)
    why = why or f"rank(s) {refused} could not join it"
    log.warning("lhc: rank %d: job %r cannot be used through the switch (%s); every rank aggregates over the "
                "process group instead, with the same codec and the same bits, and tries the switch again "
                "every %g s (set %s=1 to stop instead)", group.rank, job, why, rejoin_every_s, STRICT)
    return PathBackend(group, member, policy=policy, meet_timeout_s=meet_timeout_s, why_host=why,
                       rejoin=rejoin, rejoin_every_s=rejoin_every_s)


def _enrol(controller: str, job: str, **options: Any) -> tuple[Any, str]:
    """A membership of ``job`` (``SwitchBackend.enrol``), or None and why the controller or the socket
    refused it."""
    from host_agent.transport.switch import SwitchBackend

    try:
        return SwitchBackend.enrol(controller, job, **options), ""
    except ControllerError as exc:
        return None, f"the controller at {controller}: {exc}"
    except OSError as exc:  # the worker's own socket
        return None, f"no data-plane socket: {exc}"
