"""A small HTTP proxy in front of the loopback S3 server (moto) that injects faults.

The proxy forwards every request to the server and, for GETs of objects whose key holds
`FaultProxy.match`, applies the armed fault `count` times: ``drop`` (the connection closes
after half the body), ``slowdown`` (HTTP 503 SlowDown), ``truncate`` (a short body with a
matching Content-Length), ``alter`` (the body with its middle byte flipped), ``expired`` (HTTP 403
ExpiredToken) or ``hangup`` (the connection closes before any answer).
"""

from __future__ import annotations

import collections
import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error>"
)


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of `upstream` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.mode: str | None = None
        self.count = 0
        self.match = ".rec"
        self.injected = 0
        self.requests = 0  # GETs of matching objects seen
        self.methods: collections.Counter[str] = collections.Counter()  # any matching request
        self.in_flight = 0  # matching GETs being answered now
        self.most_in_flight = 0  # the most at once since armed
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def arm(self, mode: str | None, count: int = 1, match: str = ".rec") -> None:
        """Inject `mode` into the next `count` matching GETs."""
        with self._lock:
            self.mode, self.count, self.match, self.injected, self.requests = (
                mode,
                count,
                match,
                0,
                0,
            )
            self.methods.clear()
            self.most_in_flight = 0

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()

    def _take(self, method: str, path: str) -> str | None:
        with self._lock:
            if self.match in path:
                self.methods[method] += 1
            if method != "GET" or self.match not in path:
                return None
            self.requests += 1
            if self.mode is None or self.injected >= self.count:
                return None
            self.injected += 1
            return self.mode

    def _handler(self) -> Any:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                counted = self.command == "GET" and proxy.match in self.path
                with proxy._lock:
                    proxy.in_flight += counted
                    proxy.most_in_flight = max(proxy.most_in_flight, proxy.in_flight)
                try:
                    self._answer()
                finally:
                    with proxy._lock:
                        proxy.in_flight -= counted

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                early = proxy.mode == "hangup"  # decided before the request is forwarded
                fault = proxy._take(self.command, self.path) if early else None
                if fault == "hangup":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if not early:
                    fault = proxy._take(self.command, self.path)
                status, out_headers = resp.status, resp.getheaders()
                if fault in ("slowdown", "expired"):
                    code, message, status = (
                        ("SlowDown", "Please reduce your request rate.", 503)
                        if fault == "slowdown"
                        else ("ExpiredToken", "The provided token has expired.", 403)
                    )
                    data = _ERROR.format(code=code, message=message).encode()
                    out_headers = [("Content-Type", "application/xml")]
                elif fault == "truncate":
                    data = data[: len(data) // 2]
                elif fault == "alter" and data:
                    mid = len(data) // 2
                    data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
                self.send_response(status)
                skip = ("content-length", "transfer-encoding", "connection")
                for k, v in out_headers:
                    if k.lower() not in skip:
                        self.send_header(k, v)
                size = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", size or str(len(data)))
                self.end_headers()
                if fault == "drop":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        return Handler


def s3_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage options that send the requests to `endpoint` (the proxy)."""
    return {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}
