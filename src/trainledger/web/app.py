"""The FastAPI app: one static page and a JSON API with an OpenAPI schema (``/openapi.json``).

Rules (issue 9): request bodies are capped at :data:`MAX_BODY_BYTES`; every library call runs under
:data:`REQUEST_TIMEOUT_S`. Issue 20: an expensive call (estimate, plan, report, export) runs in a
forked child process that is killed at its deadline or when the client leaves
(:mod:`trainledger.web.isolate`), at most :data:`WORKERS` at once with at most :data:`QUEUE` waiting
(more get 503 "busy, retry" at once); cheap catalog GETs use their own threads
(:data:`CHEAP_WORKERS`) and never wait behind expensive work. No endpoint
reads or writes a file the client names (static files are a fixed list read from the package);
every response carries security headers (CSP without 'unsafe-inline', nosniff, no referrer,
frame-ancestors 'none'). Errors are 4xx with ``{"error": message, "field": form field or null}``.
fastapi is imported here only; ``import trainledger`` never imports this module.
"""


import os
from collections.abc import Callable
from importlib import resources
from typing import Any

from trainledger.errors import MissingDependency, TrainledgerError

MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 30.0
#: expensive requests computing at once (each in its own process): one core is left to the server
#: itself, so that cheap requests are answered while every slot computes; and how many may wait
WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))
QUEUE = 8
#: threads for the cheap catalog GETs (answers cached after the first call)
CHEAP_WORKERS = 4
#: seconds a "busy" answer asks the client to wait (Retry-After, RFC 9110 §10.2.3)
RETRY_AFTER_S = 2
#: seconds between checks that the client of an expensive request is still connected
DISCONNECT_POLL_S = 0.2

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"), (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]


def _need_fastapi() -> None:
    try:
        import fastapi  # noqa: F401
    except ImportError:
        raise MissingDependency("the web app needs fastapi and uvicorn: pip install 'trainledger[web]'") from None


class Guard:
    """ASGI middleware: body size limit (413), security headers on every response."""

    def __init__(self, app: Any, max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _too_large(send, self.max_body)
            return
        seen = 0
        started = False

        async def guarded_receive() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_body:
                    raise _BodyTooLarge()
            return msg

        async def secured_send(msg: dict) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                headers = [h for h in msg.get("headers", []) if h[0].lower() not in dict(SECURITY_HEADERS)]
                msg = {**msg, "headers": headers + SECURITY_HEADERS}
            await send(msg)

        try:
            await self.app(scope, guarded_receive, secured_send)
        except _BodyTooLarge:
            if not started:
                await _too_large(send, self.max_body)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Callable, limit: int) -> None:
    import json

    body = json.dumps({"error": f"request body larger than {limit:,} bytes", "field": None}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + SECURITY_HEADERS})
    await send({"type": "http.response.body", "body": body})


def _static(name: str) -> bytes:
    return resources.files("trainledger.web").joinpath("static", name).read_bytes()


_WARM: list[bool] = []


def _warm_caches() -> None:
    """Load the catalogs once in the server, so that every forked request child starts with them."""
    if _WARM:
        return
    from trainledger.web import service
    from trainledger.web.schemas import EstimateRequest

    service.gpus(), service.presets(), service.options()
    try:
        service.estimate_view(EstimateRequest())
    except Exception:  # noqa: BLE001 - warming is best effort; the request itself reports errors
        pass
    _WARM.append(True)


def create_app(allowed_hosts: list[str] | None = None, timeout_s: float = REQUEST_TIMEOUT_S,
               isolate: bool = True, workers: int = WORKERS, queue: int = QUEUE) -> Any:
    """Build the app. ``allowed_hosts``: Host header values accepted (DNS-rebinding guard); None = any.

    ``isolate``: run expensive calls in killable child processes (default; threads otherwise, or
    where the platform cannot fork). ``workers``/``queue``: expensive calls at once / waiting.
    """
    _need_fastapi()
    import anyio
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from trainledger.web import service
    from trainledger.web.schemas import ERROR_RESPONSES, EstimateRequest, ExportRequest, PlanRequest, ReportRequest

    app = FastAPI(title="trainledger", version=_version(), docs_url=None, redoc_url=None,
                  description="What hardware an LLM training job needs: estimate, plan, report, export.",
                  responses=ERROR_RESPONSES)
    from trainledger.web.isolate import Busy, Crashed, ProcessRunner, can_fork

    cheap = anyio.CapacityLimiter(CHEAP_WORKERS)
    threads = anyio.CapacityLimiter(workers)
    runner = ProcessRunner(workers, queue) if isolate and can_fork() else None
    pages = {name: _static(name) for name in STATIC}
    if runner is not None:
        _warm_caches()

    def too_slow() -> service.WebError:
        return service.WebError(f"the request took longer than {timeout_s:.0f} s; narrow it "
                                "(fewer candidate GPUs, a smaller --max-gpus)", None, 503)

    async def run(fn: Callable, *args: Any) -> Any:
        """A cheap call (catalog lists): its own threads, never behind expensive work."""
        try:
            with anyio.fail_after(timeout_s):
                return await anyio.to_thread.run_sync(fn, *args, limiter=cheap, abandon_on_cancel=True)
        except TimeoutError:
            raise too_slow() from None
        except TrainledgerError as exc:
            raise service.library_error(exc) from None

    async def run_heavy(fn: Callable, *args: Any, request: Request | None = None) -> Any:
        """An expensive call: a killable child process (or a thread where fork is missing).

        FastAPI does not notice a client that leaves while its endpoint runs, so the request is
        polled every :data:`DISCONNECT_POLL_S`; when it is gone the work is cancelled, which kills
        the child (or takes the request out of the waiting line).
        """
        import asyncio

        if runner is not None and request is not None:
            work = asyncio.ensure_future(runner.run(fn, args, timeout_s, service.child_error,
                                                    gone=request.is_disconnected))
            try:
                while True:
                    done, _ = await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
                    if done:
                        return _heavy_result(work)
                    if await request.is_disconnected():
                        await _cancel(work)
                        raise service.WebError("the client went away; the request was cancelled", None, 503)
            finally:
                await _cancel(work)
        if runner is None:
            try:
                with anyio.fail_after(timeout_s):
                    return await anyio.to_thread.run_sync(fn, *args, limiter=threads, abandon_on_cancel=True)
            except TimeoutError:
                raise too_slow() from None
            except TrainledgerError as exc:
                raise service.library_error(exc) from None
        try:
            return await runner.run(fn, args, timeout_s, service.child_error)
        except (TimeoutError, Crashed):
            raise too_slow() from None
        except Busy:
            raise busy() from None

    def busy() -> service.WebError:
        return service.WebError(f"the server is busy with {workers} estimates and {queue} waiting; "
                                f"retry in {RETRY_AFTER_S} s", None, 503)

    def _heavy_result(work: Any) -> Any:
        try:
            return work.result()
        except (TimeoutError, Crashed):
            raise too_slow() from None
        except Busy:
            raise busy() from None

    app.state.runner = runner

    @app.exception_handler(service.WebError)
    async def _web_error(request: Request, exc: service.WebError) -> JSONResponse:
        headers = {"retry-after": str(RETRY_AFTER_S)} if exc.status == 503 else None
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # framework errors (unparseable body, unknown path, wrong method) in the same {error, field} shape
        return JSONResponse({"error": str(exc.detail), "field": None}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "inputs", "prices")]
        field = loc[0] if loc else None
        msg = f"{'.'.join(loc) or 'request'}: {first.get('msg', 'invalid')}"
        return JSONResponse({"error": msg, "field": field}, status_code=422)

    def page(name: str) -> Response:
        return Response(pages[name], media_type=STATIC[name], headers={"cache-control": "no-cache"})

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return page("index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/app.js", include_in_schema=False)
    async def app_js() -> Response:
        return page("app.js")

    @app.get("/static/app.css", include_in_schema=False)
    async def app_css() -> Response:
        return page("app.css")

    @app.get("/api/presets", summary="Model presets, optionally filtered by a search string")
    async def api_presets(q: str | None = Query(None, max_length=100)) -> list[dict[str, Any]]:
        return await run(service.search_presets, q)

    @app.get("/api/gpus", summary="Catalog GPUs with their memory")
    async def api_gpus() -> list[dict[str, Any]]:
        return await run(service.gpus)

    @app.get("/api/options", summary="Choices and defaults of every form field")
    async def api_options() -> dict[str, Any]:
        return await run(service.options)

    @app.post("/api/estimate", summary="Estimate one plan: verdict, figures, charts")
    async def api_estimate(req: EstimateRequest, request: Request) -> dict[str, Any]:
        await run(service.precheck, req)
        return await run_heavy(service.estimate_view, req, request=request)

    @app.post("/api/plan", summary="Run the planner: ranked plans and rejected candidates")
    async def api_plan(req: PlanRequest, request: Request) -> dict[str, Any]:
        return await run_heavy(service.plan_view, req, request=request)

    @app.post("/api/report", summary="The full report as a file (HTML by default)",
              responses={200: {"content": {"text/html": {}, "text/markdown": {}, "text/plain": {}}}})
    async def api_report(req: ReportRequest, request: Request) -> Response:
        await run(service.precheck, req)
        text, media, name = await run_heavy(service.report_file, req, request=request)
        return Response(text, media_type=media, headers={"content-disposition": f'attachment; filename="{name}"'})

    @app.post("/api/export", summary="Launch/config files of the plan (torchrun, accelerate, deepspeed ...)")
    async def api_export(req: ExportRequest, request: Request) -> dict[str, Any]:
        return await run_heavy(service.export_files, req, request=request)

    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(Guard)  # added last = outermost: its headers are on every response
    return app


async def _cancel(task: Any) -> None:
    """Cancel ``task`` and wait for it, cancelling again if a cancellation was swallowed."""
    import asyncio

    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" warning


def _version() -> str:
    from trainledger import __version__

    return __version__
