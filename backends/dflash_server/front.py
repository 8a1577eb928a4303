"""The front-end process of `dflash-tune serve`: HTTP, parsing, tokenising, detokenising and
streaming, with the engine in the process that started it (launch.serve_engine, bridge.py)."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

from backends.dflash_server.options import ServeOptions


def run_front(options: ServeOptions, conn: Connection) -> None:
    """Serve the app over `conn`'s engine until stopped; exit 1 if the engine process went
    away first (the tuner reads a crash) or uvicorn could not start."""
    from backends.dflash_server.client import EngineClient

    configure_logging(options.log_level)
    info = server_info(options)
    client = EngineClient(conn, info, on_lost=lambda: setattr(server, "should_exit", True))
    server = http_server(options, client, info)
    client.start()
    server.run()
    if client.lost or not server.started:
        sys.exit(1)


def server_info(options: ServeOptions):
    """What the front end needs of the model: names, tokenizer, limits (configs only)."""
    from backends.dflash_server.protocol import ServerInfo, prompt_char_limit
    from dflash_core.models.architectures import target_config
    from dflash_core.models.config import read_config
    from dflash_core.training.tokenizer import load_tokenizer

    _tokenizer_path(options.target)  # a missing one says what the server needs it for
    tokenizer = load_tokenizer(options.target)
    return ServerInfo(_model_names(options)[0], tokenizer,
                      tokenizer.token_to_id("<|endoftext|>"), options.max_context,
                      _launch_card(options),
                      target_config(read_config(options.target)).vocab_size,
                      _model_names(options), prompt_char_limit(tokenizer, options.max_context))


def _launch_card(options: ServeOptions) -> dict:
    """The launch as /v1/models shows it: one flat dict, the knobs under their tuning names."""
    server = {k: v for k, v in asdict(options).items() if k not in ("launch", "runtime")}
    card = {**server, **asdict(options.launch), **asdict(options.runtime)}
    return {k: str(v) if isinstance(v, Path) else v for k, v in card.items()}


def http_server(options: ServeOptions, door, info):
    """A uvicorn Server of the app over `door` (the engine) as the options say; `run()` serves
    until it is stopped (or its `should_exit` is set), then drains (drain.py)."""
    import uvicorn

    from backends.dflash_server.app import build_app
    from backends.dflash_server.connections import (
        ACCEPT_BATCH,
        Throttled,
        connection_cap,
        guarded_protocol,
    )
    from backends.dflash_server.drain import Drain
    from backends.dflash_server.intake import Intake

    drain, throttled = Drain(options.shutdown_grace), Throttled()
    app = build_app(door, info, Intake(options.max_body_bytes, options.body_timeout), drain)
    protocol = guarded_protocol(connection_cap(options.max_connections),
                                options.header_timeout, throttled)
    config = uvicorn.Config(app, host=options.host, port=options.port, http=protocol,
                            backlog=ACCEPT_BATCH, log_level=options.log_level,
                            timeout_graceful_shutdown=5)
    return _front_server(config, info.model_name, drain, throttled)


def _model_names(options: ServeOptions) -> tuple[str, ...]:
    """What a request's `model` may say: the served name if one was given; else the target
    folder's name, or its path as given or resolved (vLLM's default name is the path, and the
    tuner's load generator sends it)."""
    if options.served_model_name:
        return (options.served_model_name,)
    target = Path(options.target)
    return tuple(dict.fromkeys((target.name, str(options.target), str(target.resolve()))))


def _tokenizer_path(target: Path) -> Path:
    path = Path(target) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the server needs a tokenizer)")
    return path


def configure_logging(level: str) -> None:
    """Our logger at uvicorn's level (its default, warning, keeps a server quiet)."""
    ours = logging.getLogger("dflash_tune")
    if not ours.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:  %(name)s: %(message)s"))
        ours.addHandler(handler)
    ours.setLevel("DEBUG" if level == "trace" else level.upper())


def _front_server(config, model: str, drain, throttled):
    """A uvicorn Server that prints where it listens once its sockets are bound (so a port 0
    shows the real one), whatever the log level (a bind that fails prints uvicorn's error);
    that drains before it stops; and that, stopped by a signal, returns instead of raising the
    signal again once it has stopped (uvicorn's habit: the process would die of it, exit -15)."""
    import asyncio
    import contextlib
    import gc

    import uvicorn

    from backends.dflash_server.connections import deepen_backlog, quiet_accept_errors

    class FrontServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            quiet_accept_errors(asyncio.get_running_loop(), throttled)
            await super().startup(sockets)
            if self.started:
                deepen_backlog([s for server in self.servers for s in server.sockets])
                # What startup loaded (torch, the tokenizer) is never garbage: out of the
                # collector's sight, a full collection under a burst of connections is short.
                gc.freeze()
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                print(f"dflash-tune serve: listening on http://{shown}:{port} (model {model})",
                      file=sys.stderr, flush=True)

        async def on_tick(self, counter: int) -> bool:
            stop = await super().on_tick(counter)
            return stop and (self.force_exit or drain.settled())

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()  # a stop signal ends run(), not the process

    return FrontServer(config)
