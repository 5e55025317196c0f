"""Run any ASGI app on a loopback port in a background thread (tests, demo, benchmarks)."""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp


class BackgroundServer:
    """`with BackgroundServer(app) as server: server.url` — a real uvicorn server on 127.0.0.1."""

    def __init__(
        self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, keep_alive_seconds: int = 75
    ) -> None:
        # Idle connections outlive the clients' own 5 s expiry, as `serve` does (server.keep_alive_seconds):
        # uvicorn's 5 s default races a pooled client's next request and resets it.
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_keep_alive=keep_alive_seconds,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="background-server", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("server thread exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start in time")
            time.sleep(0.01)
        sockets = self._server.servers[0].sockets
        self.port = sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
