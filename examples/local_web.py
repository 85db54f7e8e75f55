"""A stand-in for the web, for the examples: a local HTTP proxy that answers every request.

Give its ``proxy`` URL to an HTTP client and every ``http://`` URL, whatever
its host, is answered here -- 200 and a small page, after ``latency``
seconds -- so the examples run without a network. It records when each
host's requests arrived, to show what the throttling did. Standard library
only; the server runs in a thread.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


class LocalWeb:
    """``with LocalWeb() as web:`` serves on 127.0.0.1 until the block ends."""

    def __init__(self, latency: float = 0.05) -> None:
        self.latency = latency
        self._arrivals: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        web = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers

            def do_GET(self) -> None:
                host = urlsplit(self.path).hostname or self.headers.get("Host", "")
                with web._lock:
                    web._arrivals[host].append(time.monotonic() - web._started)
                time.sleep(web.latency)
                body = f"<html><body>a page of {host}</body></html>".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def proxy(self) -> str:
        """The proxy URL to give the client."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def arrivals(self) -> dict[str, list[float]]:
        """Per host, the seconds (since the start) at which its requests arrived."""
        with self._lock:
            return {host: sorted(times) for host, times in sorted(self._arrivals.items())}

    def report(self) -> str:
        """One line per host: when its requests arrived, relative to its first."""
        lines = []
        for host, times in self.arrivals().items():
            shown = ", ".join(f"{at - times[0]:.2f}" for at in times)
            lines.append(f"{host}: requests arrived at {shown} s")
        return "\n".join(lines)

    def __enter__(self) -> LocalWeb:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
