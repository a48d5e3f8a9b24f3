"""Run the application under uvicorn until SIGTERM or SIGINT."""

from __future__ import annotations

import uvicorn

from .app import WebConfig, create_app


async def serve(config: WebConfig, host: str, port: int, log_level: str = "info") -> None:
    """Serve `config`'s application on host:port; returns when uvicorn stops (a signal)."""
    server = uvicorn.Server(
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
