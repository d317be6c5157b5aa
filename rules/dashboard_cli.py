"""`rsi dashboard`: every campaign of a workspace in the browser, refreshed as rounds land.

A read-only HTTP server (the standard library's ThreadingHTTPServer) bound to 127.0.0.1 by
default. A watcher thread looks at each campaign's log and attempts file every `--interval`
seconds (and recomputes everything every `--full-every` seconds, for rounds built with a plain
`rsi build`); when a campaign's view changes, its new version goes to every open page over
server-sent events (`/events`), and the page fetches its new content. Views come from
rules/campaign/live.py, which writes nothing; pages are rendered by the same renderer as the
`<campaign>.dashboard` build target.

Routes: `/` (the campaigns, by task), `/campaign?c=LABEL`, `/compare?task=LABEL`,
`/api/campaigns`, `/api/campaign?c=LABEL` (the view models as JSON), `/events`, and
`/evidence/HASH/SIZE` (only blobs a page links).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import click

from rsi.errors import RsiError, UsageError


class Board:
    """The views of every campaign of a workspace and their versions, kept fresh by
    `refresh` (called by the watcher thread); readers wait on `changed`."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.views: dict[str, Any] = {}
        self.versions: dict[str, str] = {}
        self.signals = ""
        self.generation = 0
        self.error: str | None = None

    def refresh(self, force: bool = False) -> bool:
        from rules.campaign import live

        try:
            labels = live.campaign_labels(self.ws)
            sig = live.signals(self.ws, labels) + "|" + ",".join(map(str, labels))
            if not force and sig == self.signals:
                return False
            store = live.open_store_readonly(self.ws)
            views = {str(lb): live.campaign_view(self.ws, store, lb) for lb in labels}
            error = None
        except RsiError as exc:
            sig, views, error = "", {}, exc.message
        versions = {k: v.version for k, v in views.items()}
        versions["*"] = hashlib.sha256(
            json.dumps([versions, error], sort_keys=True).encode()
        ).hexdigest()[:16]
        with self.changed:
            self.signals = sig
            if versions == self.versions and error == self.error:
                return False
            self.views, self.versions, self.error = views, versions, error
            self.generation += 1
            self.changed.notify_all()
        return True

    def watch(self, stop: threading.Event, interval: float, full_every: float) -> None:
        last_full = time.monotonic()
        while not stop.wait(interval):
            full = time.monotonic() - last_full >= full_every
            if full:
                last_full = time.monotonic()
            self.refresh(force=full)

    def snapshot(self) -> tuple[dict, dict, str | None]:
        with self.lock:
            return dict(self.views), dict(self.versions), self.error


def _dash():
    from rules.campaign.documents import harness_module

    return harness_module("dashboard")


def page_url(label: str) -> str:
    return "/campaign?c=" + quote(label, safe="")


def _index_html(board: Board, views: dict, versions: dict, error: str | None) -> str:
    by_task: dict[str, list] = {}
    for cv in views.values():
        by_task.setdefault(cv.task or "(unknown task)", []).append(cv)
    groups = [
        {
            "task": task,
            "compare": "/compare?task=" + quote(task, safe=""),
            "campaigns": [
                {"label": cv.label, "url": page_url(cv.label), "view": cv.view, "error": cv.error}
                for cv in sorted(by_task[task], key=lambda c: c.label)
            ],
        }
        for task in sorted(by_task)
    ]
    return _dash().render_index(str(board.ws.root), groups, error, _live("*", versions))


def _live(key: str, versions: dict) -> dict:
    return {
        "events": "/events",
        "key": key,
        "version": versions.get(key, ""),
        "home": "/",
        "page": page_url,
    }


class Handler(BaseHTTPRequestHandler):
    board: Board
    stopping: threading.Event
    server_version = "rsi-dashboard"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # NB: a page polls; the terminal stays quiet

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: GET only\n", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _send(self, status, body: str | bytes, ctype: str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # NB: nothing is fetched from elsewhere; inline styles and the refresh script only
        self.send_header(
            "Content-Security-Policy",
            "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'",
        )
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/events":
                return self._events()
            views, versions, error = self.board.snapshot()
            if url.path in ("/", "/index.html"):
                return self._send(
                    HTTPStatus.OK, _index_html(self.board, views, versions, error), "text/html"
                )
            if url.path == "/campaign":
                cv = views.get(query.get("c", ""))
                if cv is None or cv.view is None:
                    return self._not_found(cv.error if cv else "no such campaign")
                html = _dash().render_html(cv.view, live=_live(cv.label, versions))
                return self._send(HTTPStatus.OK, html, "text/html")
            if url.path == "/compare":
                task = query.get("task", "")
                chosen = [cv.view for cv in views.values() if cv.task == task and cv.view]
                if not chosen:
                    return self._not_found(f"no campaign of task {task!r}")
                chosen.sort(key=lambda v: v["campaign"])
                html = _dash().render_compare(task, chosen, live=_live("*", versions))
                return self._send(HTTPStatus.OK, html, "text/html")
            if url.path == "/api/campaigns":
                doc = {
                    "schema": "rsi.dashboard.campaigns/1",
                    "versions": versions,
                    "error": error,
                    "campaigns": [
                        {"label": k, "task": cv.task, "error": cv.error, "view": cv.view}
                        for k, cv in sorted(views.items())
                    ],
                }
                return self._send(
                    HTTPStatus.OK, json.dumps(doc, sort_keys=True), "application/json"
                )
            if url.path == "/api/campaign":
                cv = views.get(query.get("c", ""))
                if cv is None:
                    return self._not_found("no such campaign")
                doc = {"label": cv.label, "task": cv.task, "error": cv.error, "view": cv.view}
                return self._send(
                    HTTPStatus.OK, json.dumps(doc, sort_keys=True), "application/json"
                )
            if url.path.startswith("/evidence/"):
                return self._evidence(url.path[len("/evidence/") :], views)
            return self._not_found("no such page")
        except (BrokenPipeError, ConnectionResetError):
            return None

    def _not_found(self, why: str) -> None:
        self._send(HTTPStatus.NOT_FOUND, why + "\n", "text/plain")

    def _evidence(self, text: str, views: dict) -> None:
        from rsi.digest import Digest
        from rules.campaign.live import open_store_readonly

        # NB: only a blob some page links: the server is no window onto the whole store
        if not any(text in cv.blobs for cv in views.values()):
            return self._not_found("not evidence of a campaign shown here")
        store = open_store_readonly(self.board.ws)
        try:
            data = store.read_bytes(Digest.parse(text))
        except (RsiError, OSError, AttributeError):
            return self._not_found("evidence no longer in the store")
        self._send(HTTPStatus.OK, data, "text/plain")

    def _events(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        seen = -1
        try:
            while not self.stopping.is_set():
                with self.board.changed:
                    if self.board.generation == seen:
                        self.board.changed.wait(timeout=15)
                    gen, versions = self.board.generation, dict(self.board.versions)
                if gen != seen:
                    seen = gen
                    self.wfile.write(f"event: version\ndata: {json.dumps(versions)}\n\n".encode())
                else:
                    self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            return


def serve(
    ws, host: str, port: int, interval: float, full_every: float, ready=None
) -> tuple[ThreadingHTTPServer, threading.Event]:
    """Start the server (not yet serving) and its watcher; `ready(url)` is told the URL."""
    board = Board(ws)
    board.refresh(force=True)
    stop = threading.Event()
    handler = type("BoundHandler", (Handler,), {"board": board, "stopping": stop})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(
        target=board.watch, args=(stop, interval, full_every), daemon=True, name="watch"
    ).start()
    if ready is not None:
        ready(f"http://{server.server_address[0]}:{server.server_address[1]}/")
    return server, stop


@click.command("dashboard")
@click.option("--port", type=int, default=8765, show_default=True, help="0: any free port")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address to bind; anything but localhost shows the campaigns to the network",
)
@click.option(
    "--interval", type=float, default=1.0, show_default=True, help="seconds between looks"
)
@click.option(
    "--full-every",
    type=float,
    default=15.0,
    show_default=True,
    help="seconds between full recomputes (rounds built by a plain `rsi build`)",
)
@click.pass_context
def dashboard(ctx: click.Context, port: int, host: str, interval: float, full_every: float):
    """Serve every campaign of the workspace on localhost, live and read-only: curves,
    intervals, reasons, cost, the final and the fingerprint, refreshed as rounds land."""
    from rsi.workspace import Workspace

    if interval <= 0 or full_every <= 0:
        raise UsageError("--interval and --full-every must be positive")
    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if obj.get("store"):
        ws = ws.with_overrides(store=obj["store"])
    try:
        server, stop = serve(
            ws,
            host,
            port,
            interval,
            full_every,
            ready=lambda url: print(f"rsi dashboard: serving {url} (Ctrl-C to stop)", flush=True),
        )
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
