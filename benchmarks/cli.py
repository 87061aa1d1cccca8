"""`lhc-bench SUITE [options]`: one entry point for every benchmark suite.

Each suite is a module with ``add_arguments(parser)`` and ``run(args) -> int``; it is imported only
when chosen, so one suite's dependencies never slow down or break another's.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

SUITES = {
    "codec": ("benchmarks.codec", "encode/decode speed and bytes on the wire vs memcpy and the info bound"),
    "switch": ("benchmarks.switch", "softswitch packets and aggregated words per second over UDP"),
    "aggregate": ("benchmarks.aggregate", "lhc against dense via softswitch and Gloo allreduce, W processes"),
    "train": ("benchmarks.train", "NCF, LSTM, VGG19 or BERT-base trained with DDP, PowerSGD, dense, lhc"),
    "udp": ("benchmarks.udp", "datagrams per second through the worker's channel, batched or one at a time"),
}


def comma_choices(options: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of ``options``, an unknown one refused by name."""
    def parse(text: str) -> list[str]:
        chosen = text.split(",")
        unknown = [v for v in chosen if v not in options]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(options)}")
        return chosen
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="lhc-bench", description=__doc__.splitlines()[0])
    suites_help = "; ".join(f"{name}: {about}" for name, (_, about) in SUITES.items())
    parser.add_argument("suite", choices=sorted(SUITES), help=suites_help)
    if not argv or argv[0] not in SUITES:
        parser.parse_args(argv)  # prints usage and exits on a missing or unknown suite
    module = importlib.import_module(SUITES[argv[0]][0])
    suite_parser = argparse.ArgumentParser(prog=f"lhc-bench {argv[0]}", description=SUITES[argv[0]][1])
    module.add_arguments(suite_parser)
    args = suite_parser.parse_args(argv[1:])
    args.argv = argv  # for a suite that reruns itself in a child process
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
