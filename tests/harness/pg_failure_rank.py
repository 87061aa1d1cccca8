"""One rank of the torch.distributed failure test: three calls over Gloo, rank 0 fails alone in call 1.

    python tests/harness/pg_failure_rank.py RANK WORLD PORT MODE OUTDIR

Writes OUTDIR/rankN.json: each call's outcome (tests/harness/faults.py). Ends with ``os._exit``: a peer's
collective that never completes (that is the point of the test) must not hold the process at teardown.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from host_agent.agent import Agent
from host_agent.process_group import ProcessGroupBackend
from tests.harness.faults import failing_session, outcomes


def main() -> None:
    rank, world, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    out = Path(sys.argv[5])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    agent = Agent(ProcessGroupBackend(), timeout_s=3.0)
    with failing_session(rank=0, call_number=1):
        said = outcomes(agent, 3, mode)
    (out / f"rank{rank}.json").write_text(json.dumps(said))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
