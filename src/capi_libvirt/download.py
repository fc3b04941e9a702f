"""HTTP(S) download of a base image, read in chunks: the source an image import streams into a libvirt volume.

Blocking (the standard library's http.client): it runs in the worker thread that streams the image into its volume
(hypervisor.images, through HostConnection's transfer thread), never on the event loop. Redirects are followed only
to URLs the caller allows (the host's image URL prefixes), at most MAX_REDIRECTS of them. Messages name the URL
without its query (a signed URL's token stays out of conditions and logs).
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
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


def _get(url: str, timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts = urllib.parse.urlsplit(url)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                                 context=ssl.create_default_context())
    elif parts.scheme == "http":
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    else:
        raise DownloadFailed(url, f"{shown(url)}: only http and https are supported")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("GET", target, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
        return connection, connection.getresponse()
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        raise DownloadFailed(url, f"{shown(url)} is unreachable: {type(error).__name__}: {error}") from None
