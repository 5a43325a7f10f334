"""The dashboard's routes: two pages, their JSON, their server-sent events, downloads, abort.

    GET  /                          the study: its sites, and its jobs a page at a time
    GET  /jobs/{id}                 one job (the page; its data come from the API below)
    GET  /api/me                    who the dashboard speaks as, and the pages' CSRF token
    GET  /api/overview?page=N       sites and one page of jobs
    GET  /api/overview/stream       the same, as server-sent events, on every change
    GET  /api/jobs/{id}             status, every event, the logs and each part's state changes
    GET  /api/jobs/{id}/stream      what changed, as server-sent events, until the job ends
    GET  /api/jobs/{id}/results     the results zip; /provenance its provenance record
    POST /api/jobs/{id}/abort       abort (same origin, CSRF token; the server checks the role)

The pages render every text the server sent as text (never as HTML): job names, reasons and
logs are other people's. Errors keep the server's words: another study's job answers 404
"no such job: ID", exactly like an id that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from atoll.admin.errors import AtollError, AuthError, ConnectionFailed, NotFound, Refused
from atoll.dashboard.access import Access, Secrets
from atoll.dashboard.federation import Federation

STATIC = Path(__file__).parent / "static"
PAGES = {"overview.html": "text/html", "job.html": "text/html"}
FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def chart_library() -> Path:
    """plotly.js as the plotly wheel ships it (the `dashboard` extra): no CDN, no npm."""
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise AtollError("the dashboard's charts need the plotly package: "
                         "pip install 'atoll[dashboard]'")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise AtollError(f"plotly is installed without its plotly.min.js ({path})")
    return path


def _error(exc: AtollError) -> JSONResponse:
    status = (404 if isinstance(exc, NotFound) else 403 if isinstance(exc, Refused)
              else 401 if isinstance(exc, AuthError) else 503 if isinstance(exc, ConnectionFailed)
              else 502)
    return JSONResponse({"error": str(exc)}, status_code=status)


async def _call(fn, *args) -> Response:
    try:
        return JSONResponse(await asyncio.to_thread(fn, *args))
    except AtollError as exc:
        return _error(exc)


def _job_id(request: Request) -> str | None:
    job_id = request.path_params["job_id"]
    return job_id if JOB_ID.fullmatch(job_id) else None


def _no_such_job(request: Request) -> JSONResponse:
    # the server's own words for an id it does not know
    return _error(NotFound(f"no such job: {request.path_params['job_id']}"))


def _events(source: AsyncIterator[dict], stopping: asyncio.Event) -> StreamingResponse:
    """``source`` as server-sent events, until it ends or the dashboard stops: then the page
    hears ``stopped`` and the stream ends at once (an open page would otherwise hold Ctrl-C's
    graceful shutdown until uvicorn cancels it, printing a traceback)."""
    async def lines():
        yield ": atoll\n\n"  # opens the stream at once
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                step = asyncio.ensure_future(anext(source))
                await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    yield f"data: {json.dumps({'type': 'stopped'})}\n\n"
                    return
                try:
                    event = step.result()
                except StopAsyncIteration:
                    return
                yield f"data: {json.dumps(event)}\n\n"
        finally:
            stop.cancel()

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"x-accel-buffering": "no"})


def build(fed: Federation, keys: Secrets, port: int, public: bool = False,
          stopping: asyncio.Event | None = None) -> Access:
    """The dashboard's ASGI app, behind its access checks; ``stopping``, once set, ends the
    pages' event streams (serve.py sets it when the server stops)."""
    plotly = chart_library()
    stopping = stopping or asyncio.Event()

    def _page(request: Request) -> int:
        try:
            return max(0, min(int(request.query_params.get("page", "0")), 10**6))
        except ValueError:
            return 0

    # The pages and their own files are a few KB: read once, answered from memory (a file
    # response reads in threads, which a busy machine makes a first load wait for).
    held = {name: (STATIC / name).read_bytes() for name in (*PAGES, *FILES)}

    async def overview_page(request: Request) -> Response:
        # the server's calls for the page's first event start now, while the browser fetches
        # the page's own files, instead of after them
        fed.start_overview(_page(request))
        return Response(held["overview.html"], media_type="text/html")

    async def job_page(request: Request) -> Response:
        return Response(held["job.html"], media_type="text/html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "plotly.min.js":
            return FileResponse(plotly, media_type="text/javascript")
        if name not in FILES:
            return Response("404: no such file\n", status_code=404, media_type="text/plain")
        return Response(held[name], media_type=FILES[name])

    async def me(request: Request) -> Response:
        try:
            who = await asyncio.to_thread(fed.me)
        except AtollError as exc:
            return _error(exc)
        return JSONResponse({**who, "csrf": keys.csrf})

    async def overview(request: Request) -> Response:
        try:
            return JSONResponse(await fed.overview(_page(request)))
        except AtollError as exc:
            return _error(exc)

    async def overview_stream(request: Request) -> Response:
        return _events(fed.overview_events(_page(request)), stopping)

    async def job(request: Request) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return _no_such_job(request)

        def everything():
            status = fed.status(job_id)
            return {"status": status, **fed.logs(job_id)}

        return await _call(everything)

    async def job_stream(request: Request) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return _no_such_job(request)
        return _events(fed.job_events(job_id), stopping)

    async def abort(request: Request) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return _no_such_job(request)
        return await _call(fed.abort, job_id)

    async def results(request: Request) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return _no_such_job(request)
        folder = tempfile.TemporaryDirectory(prefix="atoll-dashboard-")
        try:
            archive = await asyncio.to_thread(fed.results, job_id, Path(folder.name) / "r.zip")
        except AtollError as exc:
            folder.cleanup()
            return _error(exc)
        return FileResponse(archive, media_type="application/zip",
                            filename=f"{job_id}-results.zip",
                            background=BackgroundTask(folder.cleanup))

    async def provenance(request: Request) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return _no_such_job(request)

        def record():
            with tempfile.TemporaryDirectory(prefix="atoll-dashboard-") as tmp:
                archive = fed.results(job_id, Path(tmp) / "r.zip")
                with zipfile.ZipFile(archive) as zf:
                    if "provenance.json" not in zf.namelist():
                        raise NotFound(f"job {job_id} has no provenance record")
                    return json.loads(zf.read("provenance.json"))

        return await _call(record)

    app = Starlette(routes=[
        Route("/", overview_page),
        Route("/jobs/{job_id}", job_page),
        Route("/static/{name}", static),
        Route("/api/me", me),
        Route("/api/overview", overview),
        Route("/api/overview/stream", overview_stream),
        Route("/api/jobs/{job_id}", job),
        Route("/api/jobs/{job_id}/stream", job_stream),
        Route("/api/jobs/{job_id}/results", results),
        Route("/api/jobs/{job_id}/provenance", provenance),
        Route("/api/jobs/{job_id}/abort", abort, methods=["POST"]),
    ])
    return Access(app, keys, port, public)
