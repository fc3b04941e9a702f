"""An HTTP server of base images for the image-import tests, on loopback in the machine's own namespace (where the
operator runs and downloads; libvirt hosts receive the bytes through libvirt's upload stream, never from here).

Plain HTTP, or HTTPS with a certificate the test made (`tls`). Each path serves bytes with or without a Content-Length (without: the body ends when the connection closes, as a
streamed response), or redirects; every other path is a 404. It counts the GET requests per path, so a test can tell
how many downloads the operator made.
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import pathlib
import ssl
import threading

from devenv.loopback_server import LoopbackServer


@dataclasses.dataclass(frozen=True)
class Served:
    body: bytes = b""
    with_length: bool = True
    redirect: str | None = None  # a Location: answered with 302


class ImageServer(LoopbackServer):
    """`with ImageServer(routes) as server:` serves `routes` (path -> Served) on 127.0.0.1 at a free port."""

    def __init__(self, routes: dict[str, Served], tls: tuple[pathlib.Path, pathlib.Path] | None = None) -> None:
        """`tls`: (certificate, key) to serve HTTPS with."""
        self.routes = routes
        self.scheme = "https" if tls else "http"
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection; a body without length ends at close

            def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
                with server._lock:
                    server.requests[self.path] += 1
                served = server.routes.get(self.path)
                if served is None:
                    self.send_error(404, "no such image")
                    return
                if served.redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", served.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if served.with_length:
                    self.send_header("Content-Length", str(len(served.body)))
                self.end_headers()
                try:
                    self.wfile.write(served.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the operator read the headers and closed (the image would not fit): what the test wants

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.serve(Handler, "image-server")
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            # The handshake happens in the handler's thread (not in accept), so a client that never speaks TLS
            # holds only its own connection.
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True,
                                                     do_handshake_on_connect=False)

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def hits(self, path: str) -> int:
        with self._lock:
            return self.requests[path]
