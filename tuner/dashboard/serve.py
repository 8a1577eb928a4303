"""``serve_report``: the report over HTTP, rebuilt when the study changes or gets old.

The stdlib's threading server is enough for one page and its readers, made robust where its
defaults are not: a listen backlog for a burst of readers (the default 5 drops connections, whose
clients retry seconds later), a timeout on every connection (a client that connects and sends
nothing would hold its thread for ever) and silence for clients that leave early (each was a
15-line traceback). An ASGI server would do the same behind an optional dependency; the core
install has no ASGI server.

The page reloads itself every ``refresh_s`` seconds; a reload rebuilds the report only when the
DB changed (new trials, a nightly run) or the cached copy is ``refresh_s`` old, so idle readers
cost one cheap query.

Requests are answered only under the names the server is reached by (the bound host, localhost,
127.0.0.1, with the port): a page on another site whose DNS name is rebound to 127.0.0.1 sends its
own name as ``Host`` and is refused, so it cannot read the report from the user's browser.
"""

from __future__ import annotations

import errno
import ipaddress
import sys
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import Any

import sqlalchemy as sa

from tuner import records
from tuner import render
from tuner.dashboard.nightly import TABLE as NIGHTLY_TABLE
from tuner.dashboard.page import esc
from tuner.dashboard.report import build_report
from tuner.errors import UsageError

WILDCARDS = {"0.0.0.0", ""}  # bound to every interface
BACKLOG = 128  # connections the kernel holds until they are accepted
TIMEOUT_S = 10.0  # per read or write on a connection; a local page load takes milliseconds


@dataclass(slots=True)
class ReportCache:
    storage_url: str
    study: str
    refresh_s: int
    engine: sa.Engine
    html: bytes = b""
    fingerprint: tuple[Any, ...] = ()
    built_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def primed(cls, storage_url: str, study: str, refresh_s: int) -> ReportCache:
        """Built once, letting errors out. The DB is only read: nothing is created in it."""
        text = build_report(storage_url, study, refresh_s)
        cache = cls(storage_url, study, refresh_s, records.open_results(storage_url))
        cache.html, cache.built_at = text.encode(), time.monotonic()
        cache.fingerprint = cache._fingerprint()
        return cache

    def current(self) -> bytes:
        with self.lock:  # one rebuild at a time; readers meanwhile wait for it
            try:
                seen = self._fingerprint()
            except sa.exc.SQLAlchemyError:  # locked by a writer: judge by age alone this time
                seen = self.fingerprint
            stale = time.monotonic() - self.built_at >= self.refresh_s
            if not self.html or stale or seen != self.fingerprint:
                self._rebuild(seen)
            return self.html

    def _rebuild(self, seen: tuple[Any, ...]) -> None:
        try:
            text = build_report(self.storage_url, self.study, self.refresh_s)
        except Exception as err:  # a locked DB, a study mid-write: keep serving the last copy
            render.note(f"dashboard: rebuilding the report failed ({err}); serving the last one",
                        "yellow")
            if not self.html:
                self.html = _error_page(str(err), self.refresh_s)
            return
        self.html, self.fingerprint, self.built_at = text.encode(), seen, time.monotonic()

    def _fingerprint(self) -> tuple[Any, ...]:
        """Changes whenever a trial, a measurement, the study config or a nightly run is added."""
        t, m, s = records.trials, records.measurements, records.studies
        queries = [sa.select(sa.func.count(), sa.func.max(t.c.id)).where(t.c.study == self.study),
                   sa.select(sa.func.max(m.c.id)).where(m.c.study == self.study),
                   sa.select(s.c.updated_at).where(s.c.name == self.study)]
        with self.engine.connect() as conn:
            seen = [tuple(conn.execute(q).first() or ()) for q in queries]
            if sa.inspect(conn).has_table(NIGHTLY_TABLE):
                count = sa.text(f"SELECT COUNT(*) FROM {NIGHTLY_TABLE}")
                seen.append(conn.execute(count).scalar())
        return tuple(seen)


def make_server(storage_url: str, study: str, host: str = "127.0.0.1", port: int = 8050,
                refresh_s: int = 30) -> ThreadingHTTPServer:
    """A server for the report, listening but not yet serving. The port is taken first (a busy
    one is a ValueError before any work), then the report is built once, so a missing DB or study
    raises NoResultError here. ``port=0`` picks a free port (``server.server_address`` says
    which)."""
    names: set[str] = set()  # the Host names to answer, known once the port is bound

    class Handler(BaseHTTPRequestHandler):
        timeout = TIMEOUT_S

        def do_GET(self) -> None:
            if not host_allowed(self.headers.get("Host", ""), names, bound_port):
                self.send_error(403, "Host not allowed", "The report answers only under the "
                                f"name it listens on (http://{host}:{bound_port}/).")
                return
            if self.path.split("?")[0] not in ("/", "/index.html"):
                self.send_error(404)
                return
            body = cache.current()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # one line per reload would drown the console
            pass

    server = _bound(Handler, host, port)
    bound_port = server.server_address[1]
    names.update({host.lower(), "localhost", "127.0.0.1"})
    try:
        cache = ReportCache.primed(storage_url, study, max(1, refresh_s))
        server.server_activate()  # listen: from here on the port answers
    except BaseException:
        server.server_close()
        raise
    return server


def host_allowed(header: str, names: set[str], port: int) -> bool:
    """Whether a request's ``Host`` header names this server: one of ``names`` with the port
    (a bare name only on port 80). A server bound to every interface (0.0.0.0) also answers to
    any IP address: a literal address cannot be rebound, only a DNS name can."""
    name, sep, given = header.rpartition(":")
    if not sep or name.endswith(":"):  # no port, or an IPv6 literal without brackets
        name, given = header, "80"
    if given != str(port) or not name:
        return False
    return name.lower() in names or (bool(WILDCARDS & names) and _is_ip(name))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class _ReportServer(ThreadingHTTPServer):
    request_queue_size = BACKLOG
    daemon_threads = True  # a reader mid-download does not keep Ctrl-C from stopping the server

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the reader closed the page or went silent: nothing of ours went wrong
        super().handle_error(request, client_address)


def _bound(handler: type[BaseHTTPRequestHandler], host: str, port: int) -> ThreadingHTTPServer:
    server = _ReportServer((host, port), handler, bind_and_activate=False)
    try:
        server.server_bind()
    except OSError as err:  # a busy port, a privileged one, a host name that does not resolve
        server.server_close()
        hint = "; pick another with --port" if err.errno == errno.EADDRINUSE else ""
        raise UsageError(f"cannot listen on {host}:{port}: {err.strerror or err}{hint}") from None
    return server


def serve_report(storage_url: str, study: str, host: str = "127.0.0.1", port: int = 8050,
                 refresh_s: int = 30) -> None:
    """Serve the report at http://host:port/ until interrupted (Ctrl-C returns normally). The
    "serving" line is printed once the port answers."""
    server = make_server(storage_url, study, host, port, refresh_s)
    bound_host, bound_port = server.server_address[:2]
    render.note(f"serving the report of {study!r} on http://{bound_host}:{bound_port}/ "
                f"(refreshes every {refresh_s}s; Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _error_page(message: str, refresh_s: int) -> bytes:
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><meta http-equiv="refresh" '
            f'content="{refresh_s}"><title>dflash-tune report</title></head><body>'
            f"<p>The report could not be built: {esc(message)}</p></body></html>").encode()
