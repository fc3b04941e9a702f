"""`python -m devenv run|demo`: the local development environment behind `make run` and `make demo`.

It lives beside the product, not in it: the operator's wheel and image hold `capi_libvirt` only.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _cmd_run(args: argparse.Namespace) -> int:
    from devenv import session

    return session.run_dev(namespaces=args.namespace, force_local=args.local)


def _cmd_demo(args: argparse.Namespace) -> int:
    from devenv import demo

    logging.getLogger("kopf").setLevel(logging.WARNING)  # the narration is the demo's output
    return demo.run_demo()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m devenv", description=__doc__)
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator; without a reachable cluster, on a local control plane + host")
    run.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    run.add_argument("--local", action="store_true", help="always start the local control plane and libvirt host")
    run.set_defaults(func=_cmd_run)
    demo = sub.add_parser("demo", help="one machine's whole life on a local API server and libvirt host, narrated")
    demo.set_defaults(func=_cmd_demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
