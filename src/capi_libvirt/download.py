"""HTTP(S) download of a base image, read in chunks: the source an image import streams into a libvirt volume.

Blocking (the standard library's http.client): it runs in the worker thread that streams the image into its volume
(hypervisor.images, through HostConnection's transfer thread), never on the event loop. Redirects are followed only
to URLs the caller allows (the host's image URL prefixes), at most MAX_REDIRECTS of them. Messages name the URL
without its query (a signed URL's token stays out of conditions and logs).

Proxies come from the environment, as curl and Go programs read them: HTTPS_PROXY / HTTP_PROXY (or lowercase) name an
http:// proxy, NO_PROXY the hosts and domains reached directly. An https URL goes through the proxy's CONNECT tunnel
and its certificate is verified end to end against the image server's name (the proxy sees no plain text); an http
URL is asked of the proxy. Credentials in a proxy URL are sent as Proxy-Authorization, never shown. The trusted CAs
are the system's, or SSL_CERT_FILE's (OpenSSL's variable) for a private CA.
"""

from __future__ import annotations

import base64
import http.client
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable
from types import TracebackType

CHUNK = 1024 * 1024
TIMEOUT_S = 30.0  # per socket operation: a server that stops sending fails the import instead of hanging it
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "capi-libvirt"


class DownloadFailed(Exception):
    """The image could not be downloaded (unreachable, an HTTP error, cut short): retrying may help."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url, self.message = url, message

    def __str__(self) -> str:
        return self.message


class RedirectRefused(DownloadFailed):
    """The server redirected to a URL outside the allowed prefixes: never followed."""


def shown(url: str) -> str:
    """The URL as messages show it: without its query or fragment."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")) + ("?..." if parts.query else "")


class Download:
    """An open download: `length` (Content-Length, None when the server sends none) and `read`. Close it (or use it as
    a context manager) to drop the connection."""

    def __init__(self, url: str, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self.url = url
        self._connection, self._response = connection, response
        declared = response.getheader("Content-Length")
        self.length: int | None = int(declared) if declared and declared.isdigit() else None
        self.received = 0

    def read(self, size: int = CHUNK) -> bytes:
        """Up to `size` bytes; b"" at the end. A body shorter than its Content-Length raises DownloadFailed."""
        try:
            data = self._response.read(size)
        except (OSError, http.client.HTTPException) as error:
            raise DownloadFailed(self.url, f"downloading {shown(self.url)} failed after {self.received} bytes: "
                                           f"{type(error).__name__}: {error}") from None
        self.received += len(data)
        if not data and self.length is not None and self.received < self.length:
            raise DownloadFailed(self.url, f"{shown(self.url)} ended after {self.received} of {self.length} bytes")
        return data

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def open_image(url: str, allowed: Callable[[str], bool], timeout: float = TIMEOUT_S) -> Download:
    """GET `url`, following redirects only to URLs `allowed` accepts; the response's headers are read, its body not."""
    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        connection, response = _get(current, timeout)
        if response.status in REDIRECTS:
            location = response.getheader("Location") or ""
            connection.close()
            if not location:
                raise DownloadFailed(url, f"{shown(current)} answered HTTP {response.status} without a Location")
            target = urllib.parse.urljoin(current, location)
            if not allowed(target):
                raise RedirectRefused(url, f"{shown(current)} redirects to {shown(target)}, which is not under an "
                                           "allowed image URL prefix (LibvirtHost spec.access.imageURLPrefixes)")
            current = target
            continue
        if response.status != 200:
            connection.close()
            raise DownloadFailed(url, f"{shown(current)} answered HTTP {response.status} {response.reason}")
        return Download(current, connection, response)
    raise DownloadFailed(url, f"{shown(url)}: more than {MAX_REDIRECTS} redirects")


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url` (None: go direct, NO_PROXY matched or none set)."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()  # HTTPS_PROXY, https_proxy, ..., and "no" for NO_PROXY
    if not parts.hostname or bypassed(parts.hostname, parts.port, proxies.get("no", "")):
        return None
    return proxies.get(parts.scheme) or None


def bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether NO_PROXY reaches `host` directly, as curl reads it: `*`, or comma-separated names each matching the
    host or a domain of it (a leading dot or not), with an optional :port."""
    host = host.lower().rstrip(".")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        name, _, only_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry == "*":
            return True
        if not name or (only_port and only_port != str(port)):
            continue
        name = name.lstrip(".").rstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """A connection that reaches `url` (directly, or through its proxy), the request target to ask it for, and the
    headers the proxy needs."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise DownloadFailed(url, f"{shown(url)}: only http and https are supported")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = proxy_for(url)
    if proxy is None:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                               context=ssl.create_default_context()), target, {}
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout), target, {}
    via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if via.scheme != "http" or not via.hostname:
        raise DownloadFailed(url, f"the proxy for {shown(url)} must be an http:// URL (HTTPS_PROXY, HTTP_PROXY)")
    auth = {}
    if via.username is not None:
        token = f"{urllib.parse.unquote(via.username)}:{urllib.parse.unquote(via.password or '')}"
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(token.encode()).decode()}
    if parts.scheme == "https":
        tunnel = http.client.HTTPSConnection(via.hostname, via.port or 80, timeout=timeout,
                                             context=ssl.create_default_context())
        tunnel.set_tunnel(parts.hostname or "", parts.port or 443, headers=auth)  # TLS to the server, inside
        return tunnel, target, {}
    netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    absolute = urllib.parse.urlunsplit(("http", netloc, parts.path or "/", parts.query, ""))
    return http.client.HTTPConnection(via.hostname, via.port or 80, timeout=timeout), absolute, auth


def _get(url: str, timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection, target, proxy_headers = _connection(url, timeout)
    try:
        connection.request("GET", target, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity",
                                                   **proxy_headers})
        return connection, connection.getresponse()
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        via = " through its proxy" if proxy_for(url) else ""
        raise DownloadFailed(url, f"{shown(url)} is unreachable{via}: {type(error).__name__}: "
                                  f"{_CREDENTIALS.sub('//<credentials>@', str(error))}") from None


_CREDENTIALS = re.compile(r"//[^/@\s]+@")  # user:password@ of a URL in an error's text
