"""Run the application under uvicorn until SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

from .app import create_app
from .config import WebConfig


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT stop the server gracefully and `serve` exits 0, as `pgworker run`
        does: uvicorn's own version raises the signal again once stopped, which ends the process
        with 143 and makes an orchestrator's ordinary stop look like a crash."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


async def serve(config: WebConfig, host: str, port: int, log_level: str = "info") -> None:
    """Serve `config`'s application on host:port; returns when uvicorn stops (a signal)."""
    server = _Server(
        uvicorn.Config(
            create_app(config),
            host=host,
            port=port,
            log_config=None,  # uvicorn's lines go through pgworker's logging (stderr)
            log_level=log_level,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=5,
            lifespan="on",
        )
    )
    await server.serve()
    if not server.started:
        raise SystemExit(1)
