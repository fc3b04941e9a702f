"""An API request that never gets an answer ends at the operator's request deadline (kube.client.REQUEST_TIMEOUT_S)
instead of holding a reconcile worker forever. The silent peer is a loopback TCP server that accepts the connection
and the request and never says a word: what a connection that died without closing looks like from the client (a
real API server always answers, so it cannot play this part)."""

from __future__ import annotations

import asyncio

import pytest

from capi_libvirt.kube import api, client
from capi_libvirt.kube.kubeconfig import Credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_request_no_one_answers_ends_at_the_deadline_and_a_call_may_name_its_own(monkeypatch):
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing, close nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(client, "REQUEST_TIMEOUT_S", 1.0)
    kube = api.KubeAPI(client.KubeClient(Credentials(server=f"http://127.0.0.1:{port}")))
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await kube.get_machine("default", "m")  # not in the cache: fetched
        assert accepted, "the request reached the server"
        assert loop.time() - started >= 1.0  # the deadline ended it, not an error of the peer's
        # A call that names its own timeout keeps it.
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await kube.client.request("GET", client.object_path("cluster.x-k8s.io", "v1beta2", "machines",
                                                                "default", "m"), timeout=2.5)
        assert loop.time() - started >= 2.5
    finally:
        await kube.client.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
