"""An http.server on 127.0.0.1 at a free port, served from a thread for as long as a `with` block lasts: what the test
bed's small servers (devenv.image_server, devenv.http_proxy) are made of."""

from __future__ import annotations

import http.server
import ssl
import sys
import threading
from types import TracebackType
from typing import Self


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client refusing the TLS handshake (what a test of an unknown CA makes happen) or hanging up is no error
        of the server's: not printed. Anything else is, as http.server prints it."""
        if not isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class LoopbackServer:
    """Subclasses make their handler class and call `serve(handler, name)` in their __init__."""

    _httpd: http.server.ThreadingHTTPServer
    _thread: threading.Thread

    def serve(self, handler: type[http.server.BaseHTTPRequestHandler], name: str) -> None:
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)
