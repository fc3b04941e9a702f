"""An HTTP proxy on loopback for the image-download tests: CONNECT tunnels (https URLs) and absolute-form GETs (http
URLs), as corporate proxies serve them, each request recorded (method, target, Proxy-Authorization) so a test can tell
what went through it. With `credentials` ("user:password") it answers 407 to requests without them."""

from __future__ import annotations

import base64
import http.client
import http.server
import select
import socket
import threading
import urllib.parse

from devenv.loopback_server import LoopbackServer


class HttpProxy(LoopbackServer):
    """`with HttpProxy() as proxy:` serves on 127.0.0.1 at a free port; `proxy.url` is what HTTPS_PROXY takes."""

    def __init__(self, credentials: str | None = None) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        expected = None if credentials is None else "Basic " + base64.b64encode(credentials.encode()).decode()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def _allowed(self) -> bool:
                given = self.headers.get("Proxy-Authorization")
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, given))
                if expected is not None and given != expected:
                    self.send_response(407, "Proxy Authentication Required")
                    self.send_header("Proxy-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                return True

            def do_CONNECT(self) -> None:  # noqa: N802
                if not self._allowed():
                    return
                host, _, port = self.path.rpartition(":")
                upstream = socket.create_connection((host, int(port)), timeout=30)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.wfile.flush()
                _relay(self.connection, upstream)

            def do_GET(self) -> None:  # noqa: N802
                if not self._allowed():
                    return
                parts = urllib.parse.urlsplit(self.path)
                upstream = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
                upstream.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                                 headers={"User-Agent": self.headers.get("User-Agent", "")})
                response = upstream.getresponse()
                body = response.read()
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.serve(Handler, "http-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def seen(self) -> list[tuple[str, str, str | None]]:
        with self._lock:
            return list(self.requests)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Bytes both ways until either side closes."""
    sockets = [client, upstream]
    try:
        while True:
            readable, _, _ = select.select(sockets, [], [], 30)
            if not readable:
                return
            for source in readable:
                data = source.recv(65536)
                if not data:
                    return
                (upstream if source is client else client).sendall(data)
    finally:
        upstream.close()
