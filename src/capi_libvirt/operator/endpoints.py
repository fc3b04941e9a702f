"""The operator's HTTP endpoints: /healthz and /readyz on the health address, /metrics on the metrics address.

Both are small aiohttp servers in the operator's event loop (aiohttp comes with kopf). kopf's own liveness endpoint
is not used: it serves one path, answers 200 whatever the state, and only once the startup handlers are done, while
readiness has to say 503 too. Liveness is "the event loop is alive": /healthz is answered by the loop itself, so a
blocked or dead loop fails the probe. Readiness is election.State.readiness: standing by in the election, or leading
(or standalone) with kopf started. Metrics are rendered in the loop too, which is what lets the gauges read the operator's state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

import aiohttp.web

from capi_libvirt.operator import election, metrics

log = logging.getLogger(__name__)
DISABLED = ("", "0")


def parse_address(address: str) -> tuple[str, int] | None:
    """`host:port`, `:port` (every interface) or `[v6]:port`; None for "0" or "" (the endpoint is off)."""
    if address in DISABLED:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {address!r}: expected HOST:PORT or :PORT (or 0 to disable)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def health_routes(state: election.State) -> list[aiohttp.web.RouteDef]:
    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"alive": True})

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        ready, report = state.readiness()
        return aiohttp.web.json_response(report, status=200 if ready else 503)

    return [aiohttp.web.get("/healthz", healthz), aiohttp.web.get("/readyz", readyz)]


def metrics_routes() -> list[aiohttp.web.RouteDef]:
    async def serve_metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        body, content_type = metrics.exposition()
        return aiohttp.web.Response(body=body, headers={"Content-Type": content_type})

    return [aiohttp.web.get("/metrics", serve_metrics)]


@contextlib.asynccontextmanager
async def serving(what: str, address: str | None, routes: Iterable[aiohttp.web.RouteDef]) -> AsyncIterator[None]:
    """Serve the routes on the address for the duration of the block (nothing when the address is None or off)."""
    where = parse_address(address) if address is not None else None
    if where is None:
        yield
        return
    app = aiohttp.web.Application()
    app.add_routes(list(routes))
    runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, *where).start()
        log.info("serving %s on %s:%d", what, *where)
        yield
    finally:
        await runner.cleanup()
