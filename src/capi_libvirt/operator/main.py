"""Start the operator: kopf with the provider's handlers, watching all namespaces or the given ones.

With a Lease the replicas elect a leader (operator.election) and kopf starts only in the one that holds it; without,
the operator runs standalone. The health and metrics endpoints (operator.endpoints) are served from the start, while
standing by too. Stopping: a stop flag, or SIGTERM/SIGINT when this runs in the main thread: kopf stops its watches
and daemons and runs the cleanup handler, which closes the host connections; then the Lease is released. A leader
that loses its Lease stops kopf and raises election.LeadershipLost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence

import kopf

from capi_libvirt import __version__
from capi_libvirt.kube import api
from capi_libvirt.operator import config, election, endpoints, handlers  # noqa: F401  (handlers: registers them)

log = logging.getLogger(__name__)


async def run_operator(namespaces: Sequence[str] = (), *, operator_config: config.OperatorConfig | None = None,
                       stop_flag: asyncio.Event | None = None, memo: kopf.Memo | None = None,
                       lease: election.Lease | None = None, health_address: str | None = None,
                       metrics_address: str | None = None) -> None:
    """Run until stopped. With no namespaces the operator watches the whole cluster.

    `memo` is where the handlers keep their shared state (memo.runtime, memo.state); pass one in to look at it from
    outside. `lease`: the Lease to elect the leader in (None: standalone). The addresses are `host:port` (None or
    "0": not served).
    """
    memo = memo if memo is not None else kopf.Memo()
    memo.config = operator_config or config.from_arguments({})
    log.info("capi-libvirt %s starting: %s", __version__, _settings(memo.config, lease))
    memo.namespaces = list(namespaces)
    state = memo.state = election.State(lease)
    stop = stop_flag or asyncio.Event()
    async with endpoints.serving("health probes", health_address, endpoints.health_routes(state)), \
            endpoints.serving("metrics", metrics_address, endpoints.metrics_routes()):
        if lease is None:
            await _kopf(namespaces, stop_flag, state, memo)
            return
        async with api.new_api_client() as api_client:
            elector = election.Elector(lease, api.KubeAPI(api_client))
            with _stop_on_signals(stop):  # standing by: SIGTERM ends the wait (kopf handles signals once it runs)
                leading = await elector.acquire(state, stop)
            if not leading:
                return
            await _lead(elector, namespaces, stop, state, memo)


def _settings(settings: config.OperatorConfig, lease: election.Lease | None) -> str:
    """The settings a manager's flags decide, as its first log line says them (what an installer wrote, read back)."""
    leading = (f"leader election over the Lease {lease.namespace}/{lease.name} (duration {lease.duration_s:g}s, "
               f"renew deadline {lease.renew_deadline_s:g}s, retry period {lease.retry_period_s:g}s)"
               if lease else "standalone")
    return (f"{settings.workers} concurrent LibvirtMachine reconciles, sync period {settings.sync_period_s:g}s, "
            f"watch filter {settings.watch_filter or 'none'}, {leading}")


async def _lead(elector: election.Elector, namespaces: Sequence[str], stop: asyncio.Event, state: election.State,
                memo: kopf.Memo) -> None:
    """kopf while the Lease is renewed; the Lease released at the end, unless it was lost."""
    kopf_stop = asyncio.Event()
    keeping = asyncio.create_task(elector.keep(state))
    stopping = asyncio.create_task(stop.wait())
    for task in (keeping, stopping):
        task.add_done_callback(lambda _: kopf_stop.set())
    try:
        await _kopf(namespaces, kopf_stop, state, memo)
    finally:
        failed = keeping.exception() if keeping.done() and not keeping.cancelled() else None
        for task in (keeping, stopping):
            task.cancel()
        await asyncio.gather(keeping, stopping, return_exceptions=True)
        if failed is not None:
            raise failed  # LeadershipLost: the Lease is someone else's now, nothing to release
        await elector.release()


async def _kopf(namespaces: Sequence[str], stop_flag: asyncio.Event | None, state: election.State,
                memo: kopf.Memo) -> None:
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,  # kopf's own peering is not used: the Lease decides who runs kopf at all
        stop_flag=stop_flag,
        ready_flag=state.started,
        memo=memo,
    )


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` (only in the main thread, where signal handlers can be installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for number in signals:
        loop.add_signal_handler(number, stop.set)
    try:
        yield
    finally:
        for number in signals:
            loop.remove_signal_handler(number)
