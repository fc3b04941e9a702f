"""Run a module as the image would run it: without the packages only the test extra installs that kopf would import
on its own. `python -m bench.as_shipped MODULE ARGS...`.

The venv the benches run in has the test extra, and with it kubernetes_asyncio (the test bed's client). kopf imports
that package's generated models whenever it is importable (about 40 MB of the process), though the product never uses
it and the image does not install it (requirements.lock). Blocking its import here makes the operator's memory and
start-up what a user's Deployment has. An older checkout that still needs it (BENCH_OPERATOR_SRC, a before/after
comparison) runs with it.
"""

from __future__ import annotations

import os
import runpy
import sys

TEST_EXTRA_ONLY = ("kubernetes_asyncio",)


def main() -> None:
    if not os.environ.get("BENCH_OPERATOR_SRC"):
        for name in TEST_EXTRA_ONLY:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError, as in the image
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
