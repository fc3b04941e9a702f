"""The product's API client (kube.client) against a loopback HTTP server of the test's own: paths escaped segment by
segment, the bearer token and its file read again, an exec plugin run again after a 401, an error answer raised with
its status and the Status message. The real API server is spoken to by every integration module."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp.web
import pytest

from capi_libvirt.kube import client
from capi_libvirt.kube.kubeconfig import Credentials

pytestmark = pytest.mark.unit


def test_every_path_segment_is_escaped():
    assert client.object_path("", "v1", "secrets", "ns", "a") == "/api/v1/namespaces/ns/secrets/a"
    assert client.object_path("infrastructure.cluster.x-k8s.io", "v1alpha1", "libvirtmachines", "ns", "m", "status") \
        == "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/libvirtmachines/m/status"
    assert client.object_path("g", "v", "things", None, "../../../api/v1/secrets?x=1#y") == \
        "/apis/g/v/things/..%2F..%2F..%2Fapi%2Fv1%2Fsecrets%3Fx%3D1%23y"


@pytest.fixture
async def server():
    seen: list[tuple[str, str, str, dict | None]] = []
    answers: list[tuple[int, dict]] = []

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.method, request.raw_path, request.headers.get("Authorization", ""), body))
        status, answer = answers.pop(0) if answers else (200, {"kind": "Thing"})
        return aiohttp.web.json_response(answer, status=status)

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", seen, answers
    await runner.cleanup()


async def test_requests_carry_the_token_from_its_file_and_errors_their_status_message(server, tmp_path, monkeypatch):
    url, seen, answers = server
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    observed: list[tuple[str, str]] = []
    async with client.KubeClient(Credentials(server=url, token_file=str(token_file)),
                                 observe=lambda method, code: observed.append((method, code))) as kube:
        assert await kube.request("PATCH", "/apis/g/v/x%2Fy", {"spec": {}}, content_type=client.MERGE_PATCH) == \
            {"kind": "Thing"}
        token_file.write_text("rotated\n")
        monkeypatch.setattr(client, "TOKEN_FILE_REREAD_S", 0.0)
        answers.append((409, {"kind": "Status", "message": "the object has been modified", "reason": "Conflict"}))
        with pytest.raises(client.ApiError) as refused:
            await kube.request("GET", "/api/v1/namespaces/a/secrets/b")
    assert (refused.value.status, refused.value.message) == (409, "the object has been modified")
    assert str(refused.value) == "HTTP 409 Conflict"  # what logs and conditions say: never the body
    assert seen[0] == ("PATCH", "/apis/g/v/x%2Fy", "Bearer first", {"spec": {}})
    assert seen[1][2] == "Bearer rotated"
    assert observed == [("PATCH", "200"), ("GET", "409")]


async def test_an_exec_plugin_runs_again_when_its_token_is_refused(server, tmp_path):
    url, seen, answers = server
    count = tmp_path / "count"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"import json, pathlib\np = pathlib.Path({str(count)!r})\n"
                      "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
                      "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': f'token-{n}'}}))\n")
    credentials = Credentials(server=url, exec_plugin={"command": sys.executable, "args": [str(plugin)]})
    answers.append((401, {"kind": "Status", "message": "Unauthorized"}))
    async with client.KubeClient(credentials) as kube:
        assert await kube.request("GET", "/api/v1/nodes/n") == {"kind": "Thing"}
    assert [auth for _, _, auth, _ in seen] == ["Bearer token-1", "Bearer token-2"]


def test_credentials_never_show_their_secrets():
    shown = repr(Credentials(server="https://127.0.0.1:6443", token="s3cret", password="pw", key_data=b"KEY"))
    assert "s3cret" not in shown and "pw" not in shown and "KEY" not in shown
    assert json.dumps(shown)


async def test_requests_refused_together_run_the_plugin_once_and_none_breaks_another(server, tmp_path):
    url, seen, answers = server
    count = tmp_path / "count"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"import json, pathlib\np = pathlib.Path({str(count)!r})\n"
                      "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
                      "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': f'token-{n}'}}))\n")
    credentials = Credentials(server=url, exec_plugin={"command": sys.executable, "args": [str(plugin)]})
    async with client.KubeClient(credentials) as kube:
        assert await kube.request("GET", "/api/v1/nodes/first") == {"kind": "Thing"}  # token-1
        answers.extend([(401, {"kind": "Status"}), (401, {"kind": "Status"}), (401, {"kind": "Status"})])
        results = await asyncio.gather(*(kube.request("GET", f"/api/v1/nodes/n{i}") for i in range(3)))
    assert results == [{"kind": "Thing"}] * 3
    assert count.read_text() == "2", "one run of the plugin for the three refused requests"
    assert sorted(auth for _, _, auth, _ in seen[4:]) == ["Bearer token-2"] * 3
