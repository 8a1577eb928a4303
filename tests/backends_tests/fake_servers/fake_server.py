"""A stdlib HTTP server that misbehaves on request, to test backends.server with a real process.

    python fake_server.py --port P --mode MODE [--spawn-child] [--delay S] [--pid-file F]

Healthy modes serve GET /health and /v1/models with 200. It prints one line per event, and
`grandchild pid N` / `daemon pid N` so a test can check those processes are gone afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

MODES = ("ok", "exit-at-start", "bad-flag", "oom", "hang", "crash-after-health", "slow-start",
         "ignore-term", "daemonize")
MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
HEALTHY_ONCE = threading.Event()  # set by the first 200, so crash-after-health crashes after it


def _handler(ready_at: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/health", "/v1/models"):
                return self._reply(404, {"error": "not found"})
            if time.monotonic() < ready_at:  # like /health_generate while warming up
                return self._reply(503, {"error": "starting"})
            self._reply(200, MODELS if self.path == "/v1/models" else {"status": "ok"})
            HEALTHY_ONCE.set()

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            print("request:", fmt % args, flush=True)

    return Handler


def _serve(port: int, ready_at: float) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(ready_at))
    print(f"serving on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def _spawn_grandchild() -> None:
    child = subprocess.Popen(["sleep", "1000"])  # inherits our process group
    print(f"grandchild pid {child.pid}", flush=True)


def _daemonize(args: argparse.Namespace) -> None:
    """Serve from a process in another session, as a daemonizing server would, then idle."""
    argv = [sys.executable, __file__, "--port", str(args.port), "--mode", "ok"]
    daemon = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    with open(args.pid_file, "w") as f:
        f.write(str(daemon.pid))
    print(f"daemon pid {daemon.pid}", flush=True)
    time.sleep(1000)


def _crash_later(delay: float) -> None:
    def crash() -> None:
        HEALTHY_ONCE.wait()
        time.sleep(delay)
        print("crashing now", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=crash, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    print(f"fake server pid={os.getpid()} mode={args.mode}", flush=True)
    if args.spawn_child:
        _spawn_grandchild()
    if args.mode == "bad-flag":
        parser.error("unrecognized arguments: --bogus")  # exits 2, like the engines' argparse
    if args.mode == "exit-at-start":
        sys.exit("RuntimeError: fake server gave up")
    if args.mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if args.mode == "hang":
        time.sleep(1000)
    if args.mode == "daemonize":
        _daemonize(args)
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.mode == "crash-after-health":
        _crash_later(args.delay)
    ready_at = time.monotonic() + (args.delay if args.mode == "slow-start" else 0.0)
    _serve(args.port, ready_at)


if __name__ == "__main__":
    main()
