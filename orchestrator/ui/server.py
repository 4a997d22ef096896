"""The page's server: Starlette routes behind the guard (guard.py), served by uvicorn on
127.0.0.1 only. Reads are GETs of JSON or server-sent event streams; the actions
(kill, and stack where the API has it) are POSTs.

Every route calls the same `api` verbs as the CLI (the one front door); what blocks
(a kill, a job's curves for the CSV) runs in a worker thread, never in the loop that
serves the pages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mimetypes
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator import api
from orchestrator.api import attempts, watch
from orchestrator.api import curves as api_curves
from orchestrator.api.errors import InputError, OrchError
from orchestrator.ui.board import status_json
from orchestrator.ui.feeds import MAX_LINES
from orchestrator.ui.guard import Guard, Verdict
from orchestrator.ui.sampling import history
from orchestrator.ui.state import UiState

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LINES_TICK_S = 0.25
SLOW_TICK_S = 1.0
PING_S = 15.0
HISTORY_TICK_S = 5.0
HISTORY_EAGER_S = 30.0
LINES_PER_EVENT = 4_000
STATIC = resources.files("orchestrator.ui") / "static"
STATIC_FILES = (
    "app.js",
    "style.css",
    "vendor/uPlot.iife.min.js",
    "vendor/uPlot.min.css",
    "vendor/uPlot.LICENSE",
)
# The page runs only its own files: no inline script, no other origin, no frames.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class GuardMiddleware:
    """Every request passes the guard first; a refused one gets its status code and
    nothing else."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        verdict = self.guard.judge(scope["method"], scope["path"], query, headers)
        if verdict is not Verdict.ALLOW:
            await send(
                {
                    "type": "http.response.start",
                    "status": verdict.value,
                    "headers": [(b"content-type", b"text/plain"), *SECURITY_HEADERS],
                }
            )
            await send({"type": "http.response.body", "body": b"forbidden\n"})
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_secured)


def _error(exc: OrchError, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=status)


def _event(name: str, data: object) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Routes:
    """The routes over one server's state and token."""

    def __init__(self, state: UiState, guard: Guard) -> None:
        self.state = state
        self.guard = guard

    def app(self) -> Starlette:
        routes = [
            Route("/", self.index),
            Route("/static/{name:path}", self.static),
            Route("/api/info", self.info),
            Route("/api/jobs", self.jobs),
            Route("/api/jobs/events", self.jobs_events),
            Route("/api/job/{job_id}", self.job),
            Route("/api/job/{job_id}/events", self.job_events),
            Route("/api/job/{job_id}/curves", self.curves),
            Route("/api/job/{job_id}/curves.csv", self.curves_csv),
            Route("/api/job/{job_id}/dry-run", self.dry_run),
            Route("/api/job/{job_id}/timeline", self.timeline),
            Route("/api/curves.csv", self.compared_csv),
            Route("/api/hosts/events", self.hosts_events),
            Route("/api/action/kill/{job_id}", self.kill, methods=["POST"]),
            Route("/api/action/stack/{job_id}", self.stack, methods=["POST"]),
        ]
        return Starlette(routes=routes, middleware=[])

    # ------------------------------------------------------------ pages and files

    async def index(self, request: Request) -> Response:
        page = (STATIC / "index.html").read_text().replace("__TOKEN__", self.guard.token)
        return Response(page, media_type="text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return PlainTextResponse("not found\n", status_code=404)
        kind = mimetypes.guess_type(name)[0] or "text/plain"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        return Response((STATIC / name).read_bytes(), media_type=kind)

    async def info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "user": self.state.board.user,
                "inventories": [str(i) if i else None for i in self.state.cluster.inventories],
                "features": {"stack": _has_stack()},
            }
        )

    # ------------------------------------------------------------ jobs

    async def jobs(self, request: Request) -> Response:
        self.state.touch("jobs")
        if not self.state.board.rows:
            await asyncio.to_thread(self.state.board.refresh)
        return JSONResponse(self.state.board.rows)

    async def jobs_events(self, request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            shown = -1
            quiet = 0.0
            while True:
                self.state.touch("jobs")
                board = self.state.board
                if board.version != shown:
                    shown = board.version
                    yield _event("jobs", {"rows": board.rows, "error": board.error})
                    quiet = 0.0
                elif quiet >= PING_S:
                    yield ": ping\n\n"
                    quiet = 0.0
                await asyncio.sleep(LINES_TICK_S)
                quiet += LINES_TICK_S

        return _stream(events())

    async def _resolve(self, job_id: str) -> str:
        """A job's full id from an id or a unique prefix (InputError: none, or several)."""
        if self.state.board.row(job_id) is not None:
            return job_id
        handle = await asyncio.to_thread(api.job, job_id)
        return handle.id

    async def job(self, request: Request) -> Response:
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            (status,) = await asyncio.to_thread(api.statuses, job_id, None, ask_hosts=False)
        except OrchError as exc:
            return _error(exc, 404)
        return JSONResponse(status_json(status, self.state.board.user))

    async def job_events(self, request: Request) -> Response:
        try:
            job_id = await self._resolve(request.path_params["job_id"])
        except OrchError as exc:
            return _error(exc, 404)
        state = self.state
        row = state.board.row(job_id)
        if row is None:  # the jobs list has not been read yet
            (status,) = await asyncio.to_thread(api.statuses, job_id, None, ask_hosts=False)
            ranks, waiting = sum(len(n.ranks) for n in status.nodes), status.state.value
        else:
            ranks, waiting = int(row["ranks"]), row["state"]
        # A job waiting in line for its GPUs is followed once it starts, not before.
        feed = None if waiting == "pending" else state.feeds.get(job_id, ranks)
        store = await asyncio.to_thread(state.curves_of, job_id)

        async def events() -> AsyncIterator[str]:
            seq = points = 0
            shown_version, shown_bars, shown_top, shown_done = -1, "", 0.0, False
            slow = 0.0
            nonlocal feed
            while feed is None:
                state.touch(f"job:{job_id}")
                current = state.board.row(job_id)
                if current is not None and state.board.version != shown_version:
                    shown_version = state.board.version
                    yield _event("status", current)
                if current is not None and current["state"] != "pending":
                    feed = state.feeds.get(job_id, int(current["ranks"]))
                    break
                yield ": waiting\n\n"
                await asyncio.sleep(SLOW_TICK_S)
            while True:
                state.touch(f"job:{job_id}")
                # the whole buffer at first (a job's past, every rank's tail), then
                # what came since, at most LINES_PER_EVENT a tick (a page fallen behind
                # is told how many it missed)
                lines, seq_next, skipped = feed.since(seq, LINES_PER_EVENT if seq else MAX_LINES)
                if lines or skipped:
                    seq = seq_next
                    yield _event(
                        "lines", {"lines": [x.to_json() for x in lines], "skipped": skipped}
                    )
                bars = json.dumps(feed.bars())
                if bars != shown_bars:
                    shown_bars = bars
                    yield f"event: bars\ndata: {bars}\n\n"
                slow += LINES_TICK_S
                if slow >= SLOW_TICK_S:
                    slow = 0.0
                    if state.board.version != shown_version:
                        shown_version = state.board.version
                        current = state.board.row(job_id)
                        if current is not None:
                            yield _event("status", current)
                    new, points = store.since(points)
                    if new:
                        yield _event("points", {"points": new, "truncated": store.truncated})
                    top = state.samplers.latest(job_id)
                    if top is not None and top.time != shown_top:
                        shown_top = top.time
                        yield _event("top", top.to_json())
                    if feed.done != shown_done:
                        shown_done = feed.done
                        yield _event("feed", {"done": feed.done, "error": feed.error})
                    yield ": ping\n\n"
                await asyncio.sleep(LINES_TICK_S)

        return _stream(events())

    async def curves(self, request: Request) -> Response:
        """Every point of a job so far (`?from=N`: from its N-th on), for comparing."""
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            store = await asyncio.to_thread(self.state.curves_of, job_id)
        except OrchError as exc:
            return _error(exc, 404)
        try:
            start = max(int(request.query_params.get("from", "0")), 0)
        except ValueError:
            start = 0
        points, count = store.since(start)
        return JSONResponse({"job": job_id, "points": points, "next": count})

    async def curves_csv(self, request: Request) -> Response:
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            text = await asyncio.to_thread(_all_curves_csv, job_id)
        except OrchError as exc:
            return _error(exc, 404)
        return Response(
            text,
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{job_id}-curves.csv"'},
        )

    async def compared_csv(self, request: Request) -> Response:
        """Every point of the jobs `?ids=A,B` names (ids or unique prefixes), one CSV,
        the jobs in that order: what the compare page draws."""
        names = [i for i in request.query_params.get("ids", "").split(",") if i]
        if not names:
            return _error(InputError("no jobs to export", "?ids=JOB,JOB"))
        try:
            ids = [await self._resolve(name) for name in names]
            text = await asyncio.to_thread(_all_curves_csv, *ids)
        except OrchError as exc:
            return _error(exc, 404)
        return Response(
            text,
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="compared-curves.csv"'},
        )

    async def timeline(self, request: Request) -> Response:
        """The job's attempts on a time line: each node of each attempt a span on its
        host (api.attempts)."""
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            found = await asyncio.to_thread(attempts.timeline, job_id)
        except OrchError as exc:
            return _error(exc, 404)
        return JSONResponse(found.as_json())

    async def dry_run(self, request: Request) -> Response:
        """What `orch submit --dry-run` prints for the job's file now, with the page's
        first inventory: each host's command line and environment (the job file may
        have changed since it ran)."""
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            (status,) = await asyncio.to_thread(api.statuses, job_id, None, ask_hosts=False)
            path = status.spec.get("path")
            if not path:
                raise InputError(f"job {job_id} has no job file on record", "")
            inventory = self.state.cluster.inventories[0]
            lines = await asyncio.to_thread(api.dry_run, path, inventory)
        except OrchError as exc:
            return _error(exc)
        return JSONResponse({"job": job_id, "path": path, "lines": lines})

    # ------------------------------------------------------------ hosts

    async def hosts_events(self, request: Request) -> Response:
        state = self.state

        async def events() -> AsyncIterator[str]:
            shown = -1
            opened = time.monotonic()
            while True:
                state.touch("hosts")
                if state.cluster.version != shown:
                    shown = state.cluster.version
                    yield _event("cluster", state.cluster.found)
                recent = [
                    r["id"]
                    for r in state.board.rows
                    if r["state"] == "running" or (r.get("ended") or 0) > _an_hour_ago()
                ]
                drawn = await asyncio.to_thread(history, recent)
                yield _event("history", drawn)
                # Each second until the first sample is there (a page opened beside a
                # running job draws it at once), for half a minute at most; then at the
                # pace samples come.
                eager = not drawn["hosts"] and time.monotonic() - opened < HISTORY_EAGER_S
                await asyncio.sleep(SLOW_TICK_S if eager else HISTORY_TICK_S)

        return _stream(events())

    # ------------------------------------------------------------ actions

    async def kill(self, request: Request) -> Response:
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            result = await asyncio.to_thread(lambda: api.job(job_id).kill())
        except OrchError as exc:
            return _error(exc)
        return JSONResponse(
            {
                "job": result.job_id,
                "already": result.already.value if result.already else None,
                "killed": {host: len(procs) for host, procs in result.killed.items()},
                "port_free": result.port_free,
                "unreachable": [e.message for e in result.unreachable],
                "notes": list(result.notes),
            }
        )

    async def stack(self, request: Request) -> Response:
        """Every rank's stack, grouped, as `orch stack` prints it (kept in the job's
        records as every `orch stack` is)."""
        try:
            job_id = await self._resolve(request.path_params["job_id"])
            found = await asyncio.to_thread(watch.stack, job_id)
        except OrchError as exc:
            return _error(exc)
        text = "\n".join(watch.stack_lines(found, False))
        return JSONResponse({"job": job_id, "text": text, "saved": found.saved})


def _has_stack() -> bool:
    """Whether the page shows the stack button: the API has `orch stack`."""
    return callable(getattr(watch, "stack", None))


def _all_curves_csv(*job_ids: str) -> str:
    points: list[api_curves.MetricPoint] = []
    for job_id in job_ids:
        reader = api_curves.curves(job_id)
        while found := reader.read():
            points.extend(found)
    return api_curves.to_csv(points)


def _an_hour_ago() -> float:
    return time.time() - 3600


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"x-accel-buffering": "no"}
    )


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (0: any free port).

    Raises:
        InputError: the port is in use, or not this user's to take.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
            "pick another port: orch ui --port N (--port 0: any free one)",
        ) from None
    sock.setblocking(False)
    return sock


def make_app(state: UiState, guard: Guard) -> ASGIApp:
    """The whole page's app: the routes, behind the guard."""
    return GuardMiddleware(Routes(state, guard).app(), guard)


def static_path() -> Path:
    """Where the page's files are (for the docs and tests)."""
    return Path(str(STATIC))
