"""`python -m bench` (what `make bench` runs): see bench/__init__.py."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from bench import suite


def sizes(value: str) -> tuple[int, ...]:
    try:
        parsed = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated machine counts, e.g. 1,10,50") from None
    if not parsed or min(parsed) < 1:
        raise argparse.ArgumentTypeError("machine counts are positive")
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--sizes", type=sizes, default=(1, 10, 50), help="machine counts N (default 1,10,50)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per N and contender (default 3)")
    parser.add_argument("--idle-seconds", type=float, default=120.0, help="each idle measurement (default 120)")
    parser.add_argument("--floor-concurrency", type=int, default=0,
                        help="threads of the floor (default: the operator's default creations per host)")
    parser.add_argument("--operator-arg", action="append", default=[], help="passed to `capi-libvirt run`")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    parser.add_argument("--name", default="latest", help="results file stem (default latest)")
    parser.add_argument("--rewrite", type=pathlib.Path, metavar="RESULTS.json",
                        help="only write the table and plot again from a results file")
    parser.add_argument("--libvirtd-log", type=pathlib.Path, help="with --rewrite: summarise this libvirtd log again")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.rewrite:
        suite.rewrite(args.rewrite, args.libvirtd_log)
        return 0
    suite.run(suite.Settings(sizes=args.sizes, rounds=args.rounds, idle_s=args.idle_seconds,
                             floor_concurrency=args.floor_concurrency, operator_args=tuple(args.operator_arg),
                             out=args.out, name=args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
