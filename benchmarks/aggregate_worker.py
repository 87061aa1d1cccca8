"""One worker process of ``lhc-bench aggregate``: join the job, aggregate its bucket in each mode, report.

    python -m benchmarks.aggregate_worker --controller ADDR --job NAME --length N --density D
        --workers W --modes dense,sketch --repeats R --seed S [--loss P] [--loss-burst B] [--engine E]
        [--gloo-init URL] [--agents K]

With ``--agents K`` the process runs K workers of the job, each an agent with its own socket, joined on
its own thread: how a run of 64 or more workers fits two cores (one interpreter and one copy of the
inputs per K workers instead of per worker). They share the interpreter's lock, so their times include
waiting for each other.

Every worker derives every worker's input from the seed, so each one checks its own results exactly
against the plain sum of the quantized inputs. Each timed call starts after a one-word aggregation that
lines the workers up; one untimed call per mode first gives the codec its steady-state sizes. Prints one
JSON line per mode on stdout; with ``--gloo-init``, then one for the same buckets allreduced by Gloo and
one for them aggregated by the codec over that process group (``benchmarks.aggregate_gloo``: rows
``gloo`` and ``hosts``), the agent's rank becoming the process group's.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

from benchmarks.aggregate_gloo import process_group_rows, worst
from host_agent.agent import Agent
from host_agent.transport.channel import Impairment


def bucket(rank: int, length: int, density: float, seed: int) -> torch.Tensor:
    """Worker ``rank``'s sparse float32 gradient: ``density * length`` random positions."""
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    x = torch.zeros(length)
    hit = torch.randperm(length, generator=generator)[: max(1, int(length * density))]
    x[hit] = torch.randn(hit.numel(), generator=generator) * 1e-2
    return x


def expected(inputs: list[torch.Tensor], scale: int | None) -> torch.Tensor:
    from host_agent.codec.quantize import dequantize, quantize

    total = torch.zeros(inputs[0].numel(), dtype=torch.int64)
    for x in inputs:
        total += quantize(x, scale)
    return dequantize(total.to(torch.int32), scale, torch.float32)


def run_agent(args: argparse.Namespace, everyone: list[torch.Tensor]) -> tuple[list[dict], int, torch.Tensor]:
    """One worker: join, aggregate in every mode, and the JSON rows, its rank and its bucket."""
    impairment = Impairment(loss=args.loss, duplicate=0.0, burst=args.loss_burst)
    rows = []
    with Agent.join(args.controller, args.job, impairment=impairment, timeout_s=120.0, ip=args.ip,
                    host=args.host, engine=args.engine) as agent:
        mine = everyone[agent.rank]
        line_up = torch.zeros(1, dtype=torch.int32)
        for mode in args.modes.split(","):
            agent.allreduce(mine, mode=mode, key=mode)  # steady-state sizes and scale for this mode
            times, exact, errors, result = [], True, [], None
            before = agent.backend.counters()
            for _ in range(args.repeats):
                agent.allreduce(line_up, mode="dense", key="line-up")
                started = time.perf_counter()
                result = agent.allreduce(mine, mode=mode, key=mode)
                times.append(time.perf_counter() - started)
                reference = expected(everyone, result.stats["codec"]["scale"])
                exact &= torch.equal(result.total, reference)
                errors.append((result.total - reference).abs().max().item())
            stats = result.stats
            counted = {name: value - before.get(name, 0) for name, value in agent.backend.counters().items()}
            rows.append({
                "mode": mode, "chosen": stats["mode"], "rank": agent.rank, "seconds": min(times),
                # lossless: the result must equal the sum of the quantized inputs bit for bit
                "reference": "quantized integer sum", "exact": exact, "max_error": worst(errors),
                "tolerance": 0.0, "bytes_per_worker": stats["bytes_sent"], "packets": stats["packets"],
                "retransmissions": counted["retransmissions"],
                "fast_retransmissions": counted["fast_retransmissions"],
                "timer_retransmissions": counted["timer_retransmissions"],
                "tail_probes": counted["tail_probes"],
                "rtt_s": agent.backend.stream.rtt.srtt, "rto_s": agent.backend.stream.rtt.rto,
                "dropped": counted["dropped_out"] + counted["dropped_in"],
                "encode_s": stats["encode_s"], "network_s": stats["network_s"], "decode_s": stats["decode_s"],
            })
        return rows, agent.rank, mine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aggregate_worker")
    parser.add_argument("--controller", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--density", type=float, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--modes", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--loss-burst", type=int, default=1, help="datagrams lost together (default 1)")
    parser.add_argument("--ip", default="127.0.0.1", help="this worker's data-plane IPv4")
    parser.add_argument("--host", default="", help="join as this topology host")
    parser.add_argument("--engine", choices=("native", "python"), help="the agents' packet engine")
    parser.add_argument("--gloo-init", help="also allreduce with Gloo, rendezvous at this init_method URL")
    parser.add_argument("--gloo-rank", type=int,
                        help="this process's rank in the Gloo group, 0 at the --gloo-init address (default: "
                             "the agent's, which the switch job gives in the order the workers join)")
    parser.add_argument("--agents", type=int, default=1, help="workers this process runs (default 1)")
    args = parser.parse_args(argv)
    if args.agents < 1 or (args.gloo_init and args.agents != 1):
        parser.error("--agents must be at least 1, and 1 with --gloo-init (Gloo's ranks are processes)")
    torch.set_num_threads(1)
    everyone = [bucket(r, args.length, args.density, args.seed) for r in range(args.workers)]
    outcomes: dict[int, tuple[list[dict], int, torch.Tensor] | BaseException] = {}

    def member(i: int) -> None:
        try:
            outcomes[i] = run_agent(args, everyone)
        except BaseException as exc:  # reported below, after every agent finished
            outcomes[i] = exc

    threads = [threading.Thread(target=member, args=(i,)) for i in range(args.agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for outcome in outcomes.values():
        if isinstance(outcome, BaseException):
            raise outcome
        for row in outcome[0]:
            print(json.dumps(row), flush=True)
    if args.gloo_init:  # after the agent has left: its I/O thread no longer shares the cores
        _, rank, mine = outcomes[0]
        rank = rank if args.gloo_rank is None else args.gloo_rank
        for row in process_group_rows(mine, everyone, rank, args.gloo_init, args.repeats, expected):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
