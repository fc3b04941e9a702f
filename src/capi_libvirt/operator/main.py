"""Start the operator: kopf with the provider's handlers, watching all namespaces or the given ones."""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

import kopf

from capi_libvirt.operator import config, handlers  # noqa: F401  (handlers: registers them)

log = logging.getLogger(__name__)


async def run_operator(namespaces: Sequence[str] = (), *, operator_config: config.OperatorConfig | None = None,
                       stop_flag: asyncio.Event | None = None, memo: kopf.Memo | None = None) -> None:
    """Run until stopped. With no namespaces the operator watches the whole cluster.

    `memo` is where the handlers keep their shared state (memo.runtime); pass one in to look at it from outside.
    """
    memo = memo if memo is not None else kopf.Memo()
    memo.config = operator_config or config.from_environment()
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,
        stop_flag=stop_flag,
        memo=memo,
    )
