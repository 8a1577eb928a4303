"""The front-end process of `dflash-tune serve`: HTTP, parsing, tokenising, detokenising and
streaming, with the engine in the process that started it (launch.serve_engine, bridge.py)."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection


def run_front(options, conn: Connection) -> None:
    """Serve the app over `conn`'s engine until stopped; exit 1 if the engine process went
    away first (the tuner reads a crash) or uvicorn could not start."""
    from backends.dflash_server.app import build_app
    from backends.dflash_server.client import EngineClient
    from backends.dflash_server.launch import configure_logging, server_info, uvicorn_server

    configure_logging(options.log_level)
    info = server_info(options)
    client = EngineClient(conn, info, on_lost=lambda: setattr(server, "should_exit", True))
    server = uvicorn_server(options, build_app(client, info), info.model_name)
    client.start()
    server.run()
    if client.lost or not server.started:
        sys.exit(1)
