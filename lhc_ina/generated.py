"""The command line every file generated from ``lhc_ina/constants.py`` has (the P4 include, the Wireshark
dissector): write it, or with ``--check`` fail when the committed copy is out of date."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def generator_main(argv: list[str] | None, description: str, default_output: Path, render: Callable[[], str],
                   out_of_date: str) -> int:
    """Write ``render()`` to ``--output`` (default ``default_output``); with ``--check`` write nothing and
    return 1, saying ``out_of_date`` after the file's name, when the file differs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="fail if the committed file is out of date")
    parser.add_argument("--output", type=Path, default=default_output)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date{out_of_date}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0
