"""`lhc-bench codec`'s launch figures: the device operations the codec's GPU path takes for one bucket.

``gpu_launches`` is counted by the codec (``count_launches``, :mod:`host_agent.codec.gpu.launches`) for worker
0 of the row's own case: on a CUDA device as it runs; on a CPU, worker 0 alone runs the GPU path in
Triton's interpreter (the other workers run the CPU kernels, and the totals must agree bit for bit), so
a machine without a GPU counts what the GPU would launch. On a CUDA device the profiler also lists what
really ran for one worker alone (``profiled_launches``), beside the codec's count of the same session.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

INTERPRET = "TRITON_INTERPRET"


@contextmanager
def interpreter_for(device: str) -> Iterator[None]:
    """On a CPU run, the GPU path's counts come from Triton's interpreter, which must be chosen before
    the kernels are defined (their modules are imported only when the path first runs); the setting is
    the run's alone."""
    if device != "cpu" or INTERPRET in os.environ:
        yield
        return
    os.environ[INTERPRET] = "1"
    try:
        yield
    finally:
        del os.environ[INTERPRET]


def counted_launches(xs: list[torch.Tensor], mode: str, block: int, state, options: dict) -> dict | None:
    """Worker 0's ``gpu_launches`` for one aggregation of ``xs`` (None where Triton is missing)."""
    from host_agent.codec import aggregate_local
    from host_agent.codec.gpu import interpreting, triton_available

    on_cpu = xs[0].device.type == "cpu"
    if not triton_available() or (on_cpu and not interpreting()):
        return None
    first = {"count_launches": True, **({"kernels": "triton"} if on_cpu else {})}
    workers = [first] + [{}] * (len(xs) - 1)
    result = aggregate_local(xs, mode=mode, block=block, state=state, worker_options=workers,
                             **{**options, "timing": False})
    return result.stats["gpu_launches"]


def profiled_launches(x: torch.Tensor, mode: str, block: int, options: dict) -> dict:
    """One worker alone on a CUDA device (W = 1: its messages are their own aggregate), its second
    aggregation: the codec's count and the profiler's list of device operations while it computed
    (the driver's copies of its messages to the host lie outside the profiled windows)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from host_agent.codec import WorkerSession, aggregate_local

    options = {**options, "timing": False}
    state = aggregate_local([x], mode=mode, block=block, **options).state
    session = WorkerSession(x, 0, 1, mode=mode, block=block, state=state, count_launches=True, **options)
    names: Counter[str] = Counter()

    @contextmanager
    def profiled() -> Iterator[None]:
        torch.cuda.synchronize(x.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            yield
            torch.cuda.synchronize(x.device)
        names.update(e.name for e in prof.events() if e.device_type == DeviceType.CUDA)

    drive_alone(session, profiled)
    counted = session.result().stats["gpu_launches"]
    return {"counted": counted, "counted_total": sum(counted.values()), "profiled_total": sum(names.values()),
            "profiled": dict(names.most_common(16))}


def drive_alone(session, around) -> None:
    """Run a one-worker session to its end (its messages are their own aggregate, handed back from the
    host as a transport would), each ``advance`` inside ``around()`` and nothing else."""
    while not session.done:
        with around():
            session.advance()
        while session.ready_messages:
            message = session.next_message()
            assert message is not None
            session.receive(message.words.cpu())
