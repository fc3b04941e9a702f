"""Start the operator: kopf with the provider's handlers, watching all namespaces or the given ones.

With a peering name the replicas elect a leader (operator.election); without, the operator runs standalone. The
health and metrics endpoints (operator.endpoints) are served for exactly as long as kopf runs. Stopping: a stop flag,
or SIGTERM/SIGINT when this runs in the main thread (kopf installs the handlers): kopf stops its watches and daemons,
removes this replica's peering record and runs the cleanup handler, which closes the host connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import kopf

from capi_libvirt.operator import config, election, endpoints, handlers  # noqa: F401  (handlers: registers them)

log = logging.getLogger(__name__)


async def run_operator(namespaces: Sequence[str] = (), *, operator_config: config.OperatorConfig | None = None,
                       stop_flag: asyncio.Event | None = None, memo: kopf.Memo | None = None,
                       peering: str | None = None, health_address: str | None = None,
                       metrics_address: str | None = None) -> None:
    """Run until stopped. With no namespaces the operator watches the whole cluster.

    `memo` is where the handlers keep their shared state (memo.runtime, memo.state); pass one in to look at it from
    outside. `peering`: the ClusterKopfPeering to elect the leader in (None: standalone). The addresses are
    `host:port` (None or "0": not served).
    """
    memo = memo if memo is not None else kopf.Memo()
    memo.config = operator_config or config.from_environment()
    memo.namespaces = list(namespaces)
    me = election.Peering.new(peering) if peering else None
    state = memo.state = election.State(me)
    async with endpoints.serving("health probes", health_address, endpoints.health_routes(state)), \
            endpoints.serving("metrics", metrics_address, endpoints.metrics_routes()):
        await kopf.operator(
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=me is None,
            peering_name=me.name if me else None,
            priority=me.priority if me else None,
            identity=me.identity if me else None,  # type: ignore[arg-type]  # kopf's Identity: unexported NewType(str)
            stop_flag=stop_flag,
            ready_flag=state.started,
            memo=memo,
        )
