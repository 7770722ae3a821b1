"""The FastAPI app: one static page and a JSON API with an OpenAPI schema (``/openapi.json``).

Rules (issue 9): request bodies are capped at :data:`MAX_BODY_BYTES`; every library call runs in a
worker thread under :data:`REQUEST_TIMEOUT_S` with at most :data:`WORKERS` at once; no endpoint
reads or writes a file the client names (static files are a fixed list read from the package);
every response carries security headers (CSP without 'unsafe-inline', nosniff, no referrer,
frame-ancestors 'none'). Errors are 4xx with ``{"error": message, "field": form field or null}``.
fastapi is imported here only; ``import trainledger`` never imports this module.
"""


from collections.abc import Callable
from importlib import resources
from typing import Any

from ..errors import MissingDependency, TrainledgerError

MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 30.0
WORKERS = 2

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


def create_app(allowed_hosts: list[str] | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """Build the app. ``allowed_hosts``: Host header values accepted (DNS-rebinding guard); None = any."""
    _need_fastapi()
    import anyio
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from . import service
    from .schemas import ERROR_RESPONSES, EstimateRequest, ExportRequest, PlanRequest, ReportRequest

    app = FastAPI(title="trainledger", version=_version(), docs_url=None, redoc_url=None,
                  description="What hardware an LLM training job needs: estimate, plan, report, export.",
                  responses=ERROR_RESPONSES)
    limiter = anyio.CapacityLimiter(WORKERS)
    pages = {name: _static(name) for name in STATIC}

    async def run(fn: Callable, *args: Any) -> Any:
        try:
            with anyio.fail_after(timeout_s):
                return await anyio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)
        except TimeoutError:
            raise service.WebError(f"the request took longer than {timeout_s:.0f} s; narrow it "
                                   "(fewer candidate GPUs, a smaller --max-gpus)", None, 503) from None
        except TrainledgerError as exc:
            raise service.library_error(exc) from None

    @app.exception_handler(service.WebError)
    async def _web_error(request: Request, exc: service.WebError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=exc.status)

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
    async def api_estimate(req: EstimateRequest) -> dict[str, Any]:
        return await run(service.estimate_view, req)

    @app.post("/api/plan", summary="Run the planner: ranked plans and rejected candidates")
    async def api_plan(req: PlanRequest) -> dict[str, Any]:
        return await run(service.plan_view, req)

    @app.post("/api/report", summary="The full report as a file (HTML by default)",
              responses={200: {"content": {"text/html": {}, "text/markdown": {}, "text/plain": {}}}})
    async def api_report(req: ReportRequest) -> Response:
        text, media, name = await run(service.report_file, req)
        return Response(text, media_type=media, headers={"content-disposition": f'attachment; filename="{name}"'})

    @app.post("/api/export", summary="Launch/config files of the plan (torchrun, accelerate, deepspeed ...)")
    async def api_export(req: ExportRequest) -> dict[str, Any]:
        return await run(service.export_files, req)

    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(Guard)  # added last = outermost: its headers are on every response
    return app


def _version() -> str:
    from .. import __version__

    return __version__
