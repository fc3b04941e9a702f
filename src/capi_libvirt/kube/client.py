"""The operator's HTTP client of the Kubernetes API: JSON requests on aiohttp, the library kopf already runs on.

The provider reads and writes plain JSON objects (custom resources, Secrets, Events, Leases, a workload Node), so it
needs no generated models: a request is a method, a path and a JSON body, its answer a dict. Leaving the generated
client out keeps about 40 MB of models out of the process and the image (kopf imports them whenever they are
installed). What client-go gives every Cluster API manager is kept:
- TLS verified against the kubeconfig's or the ServiceAccount's CA (never skipped unless the kubeconfig says
  insecure-skip-tls-verify), client certificates, bearer tokens re-read from their file every minute (a rotated
  ServiceAccount token), basic auth, exec credential plugins (run again when the server answers 401);
- a deadline per request (REQUEST_TIMEOUT_S; a call may name its own), so a connection that died without a word
  never holds a reconcile worker;
- client-go's token bucket (--kube-api-qps, --kube-api-burst) and a hook that counts each request by method and code.
An answer outside 2xx raises ApiError with the status, its reason and the Status object's message; bodies are never
logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import yarl

from capi_libvirt.kube.kubeconfig import Credentials, ExecCredential, run_exec_plugin

# How long one API request may take (never a watch: kopf runs those on its own session). aiohttp waits forever by
# default, and a request on a connection that died without a word (an API server gone without closing it, a load
# balancer's dropped flow) would hold a reconcile worker, and any creation slot it holds, for the operator's life.
REQUEST_TIMEOUT_S = 60.0
TOKEN_FILE_REREAD_S = 60.0  # client-go's cached token source reads the file again after a minute
CONNECTIONS = 32  # at most this many requests in flight at once (the rate limit paces them)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

RequestObserver = Callable[[str, str], None]  # (HTTP method, status code or "<error>"), once per request


class ApiError(Exception):
    """The API server answered outside 2xx."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status, self.reason, self.message = status, reason, message


class RateLimit:
    """client-go's token bucket (--kube-api-qps, --kube-api-burst): `burst` requests at once, then `qps` a second."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit: qps {qps:g} must be above 0 and burst {burst} at least 1")
        self.qps, self.burst, self.clock = qps, burst, clock
        self.tokens, self.updated = float(burst), clock()
        self._lock = asyncio.Lock()

    def delay(self) -> float:
        """Take a token; the seconds to wait before the request it stands for may go (0: at once)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.qps)
        self.updated = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps

    async def wait(self) -> None:
        async with self._lock:  # one request's turn at a time, in the order they came
            delay = self.delay()
            if delay > 0:
                await asyncio.sleep(delay)


def _load_chain(context: ssl.SSLContext, certificate: str | bytes | None, key: str | bytes | None) -> None:
    """A client certificate and key from their files, or from PEM data (through a private file of this process that
    lives only while the SSL context reads it)."""
    if certificate is None or key is None:
        return
    if isinstance(certificate, str) and isinstance(key, str):
        context.load_cert_chain(certificate, key)
        return
    with tempfile.TemporaryDirectory(prefix="capi-libvirt-client-") as folder:  # mode 0700
        paths = []
        for name, value in (("tls.crt", certificate), ("tls.key", key)):
            path = os.path.join(folder, name)
            data = value if isinstance(value, bytes) else open(value, "rb").read()  # noqa: SIM115 (closed at once)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])


def ssl_context(credentials: Credentials, exec_credential: ExecCredential | None = None) -> ssl.SSLContext | None:
    """None for a plain-HTTP server. Verification stays on but where the kubeconfig turned it off."""
    if not credentials.server.startswith("https://"):
        return None
    context = ssl.create_default_context(
        cafile=credentials.ca_path,
        cadata=credentials.ca_data.decode("ascii", errors="replace") if credentials.ca_data else None)
    if credentials.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if exec_credential is not None and exec_credential.certificate_data:
        _load_chain(context, exec_credential.certificate_data, exec_credential.key_data)
    else:
        _load_chain(context, credentials.certificate_data or credentials.certificate_path,
                    credentials.key_data or credentials.key_path)
    return context


def _status_message(text: bytes) -> str:
    """The Status object's message of an error answer (empty when it has none)."""
    try:
        body = json.loads(text)
    except ValueError:
        return ""
    return str(body.get("message") or "") if isinstance(body, dict) else ""


class KubeClient:
    """One API server, one aiohttp session (made in the running event loop at the first request)."""

    def __init__(self, credentials: Credentials, observe: RequestObserver | None = None,
                 rate_limit: RateLimit | None = None) -> None:
        self.credentials, self.observe, self.rate_limit = credentials, observe, rate_limit
        self._session: aiohttp.ClientSession | None = None
        self._exec: ExecCredential | None = None
        self._token: str | None = credentials.token
        self._token_read = -TOKEN_FILE_REREAD_S
        self._opening = asyncio.Lock()  # the first requests, all at once, make one session
        self._closing: list[tuple[aiohttp.ClientSession, asyncio.TimerHandle]] = []  # replaced, closed later
        self._retired: set[asyncio.Future[None]] = set()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        for old, timer in self._closing:
            timer.cancel()
            await old.close()
        self._closing.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _open(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        async with self._opening:
            if self._session is None:
                if self.credentials.exec_plugin is not None and self._exec is None:
                    self._exec = await asyncio.to_thread(run_exec_plugin, self.credentials)
                context = await asyncio.to_thread(ssl_context, self.credentials, self._exec)  # reads files
                connector = aiohttp.TCPConnector(ssl=context if context is not None else False, limit=CONNECTIONS)
                self._session = aiohttp.ClientSession(connector=connector)
            return self._session

    async def _authorization(self) -> dict[str, str]:
        if self._exec is not None and self._exec.token:
            return {"Authorization": f"Bearer {self._exec.token}"}
        token_file = self.credentials.token_file
        if token_file is not None and time.monotonic() - self._token_read >= TOKEN_FILE_REREAD_S:
            with contextlib.suppress(OSError):  # a file being rotated: keep the token read last
                self._token = (await asyncio.to_thread(_read_text, token_file)).strip()
                self._token_read = time.monotonic()
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        if self.credentials.username is not None:
            basic = aiohttp.BasicAuth(self.credentials.username, self.credentials.password or "")
            return {"Authorization": basic.encode()}
        return {}

    async def request(self, method: str, path: str, body: Any = None, *, content_type: str = JSON,
                      params: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        """The answer's JSON (None for an empty answer); ApiError for a status outside 2xx, asyncio.TimeoutError
        after `timeout` (REQUEST_TIMEOUT_S unless given)."""
        status, text, used = await self._observed(method, path, body, content_type, params, timeout)
        if status == 401 and self.credentials.exec_plugin is not None:  # the plugin's credential expired: again
            await self._refresh_exec(used)
            status, text, _ = await self._observed(method, path, body, content_type, params, timeout)
        if not 200 <= status <= 299:
            reason = _REASONS.get(status, "")
            raise ApiError(status, reason, _status_message(text))
        return json.loads(text) if text else None

    async def _refresh_exec(self, used: ExecCredential | None) -> None:
        """Run the exec plugin again, once for all the requests refused with the credential `used`. A new client
        certificate needs a new session; the old one is closed once the requests in flight on it are past their
        deadline."""
        async with self._opening:
            if self._exec is not used:
                return  # another request refreshed it meanwhile
            self._exec = await asyncio.to_thread(run_exec_plugin, self.credentials)
            if self._exec.certificate_data and self._session is not None:
                old, self._session = self._session, None
                closing = asyncio.get_running_loop().call_later(
                    REQUEST_TIMEOUT_S, lambda: self._retired.add(asyncio.ensure_future(old.close())))
                self._closing.append((old, closing))

    async def _observed(self, method: str, path: str, body: Any, content_type: str,
                        params: Mapping[str, str] | None,
                        timeout: float | None) -> tuple[int, bytes, ExecCredential | None]:
        """One request, after its turn under the rate limit, counted by the observer; with the exec plugin's
        credential it was sent with."""
        if self.rate_limit is not None:
            await self.rate_limit.wait()
        try:
            answer = await self._send(method, path, body, content_type, params, timeout)
        except BaseException:
            if self.observe is not None:
                self.observe(method, "<error>")
            raise
        if self.observe is not None:
            self.observe(method, str(answer[0]))
        return answer

    async def _send(self, method: str, path: str, body: Any, content_type: str, params: Mapping[str, str] | None,
                    timeout: float | None) -> tuple[int, bytes, ExecCredential | None]:
        session = await self._open()
        used = self._exec
        headers = {"Accept": JSON, **(await self._authorization())}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        deadline = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S if timeout is None else timeout)
        url = yarl.URL(self.credentials.server + path, encoded=True)  # the path's segments are escaped already
        async with session.request(method, url, data=data, params=params, headers=headers,
                                   timeout=deadline) as response:
            return response.status, await response.read(), used


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


_REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 410: "Gone", 422: "Unprocessable Entity", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable", 504: "Gateway Timeout"}


def _segment(value: str) -> str:
    return quote(value, safe="")


def object_path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
                subresource: str | None = None) -> str:
    """The REST path of a resource (group "" is the core API), a namespace's or the cluster's, one object of it, or
    its subresource. Every segment is escaped: a name never turns into another path."""
    path = f"/api/{_segment(version)}" if not group else f"/apis/{_segment(group)}/{_segment(version)}"
    if namespace is not None:
        path += f"/namespaces/{_segment(namespace)}"
    path += f"/{_segment(plural)}"
    if name is not None:
        path += f"/{_segment(name)}"
    if subresource is not None:
        path += f"/{_segment(subresource)}"
    return path
