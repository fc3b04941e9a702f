"""Start the operator: kopf with the provider's handlers, watching all namespaces or the given ones."""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

import kopf

from capi_libvirt.operator import handlers  # noqa: F401  (registers the handlers)

log = logging.getLogger(__name__)


async def run_operator(namespaces: Sequence[str] = (), *, stop_flag: asyncio.Event | None = None) -> None:
    """Run until stopped. With no namespaces the operator watches the whole cluster."""
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,
        stop_flag=stop_flag,
    )
