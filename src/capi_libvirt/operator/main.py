"""Start the operator: kopf with the provider's handlers, watching all namespaces or the given ones."""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

import kopf

from capi_libvirt.operator import config, handlers  # noqa: F401  (handlers: registers them)

log = logging.getLogger(__name__)


async def run_operator(namespaces: Sequence[str] = (), *, operator_config: config.OperatorConfig | None = None,
                       stop_flag: asyncio.Event | None = None) -> None:
    """Run until stopped. With no namespaces the operator watches the whole cluster."""
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,
        stop_flag=stop_flag,
        memo=kopf.Memo(config=operator_config or config.from_environment()),
    )
