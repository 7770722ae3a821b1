"""Local web app: a JSON API (FastAPI, OpenAPI schema) and one static page that calls it.

``create_app()`` builds the app; ``serve(host, port)`` runs it with uvicorn (127.0.0.1 by
default). fastapi and uvicorn are imported lazily; without them a MissingDependency names
``pip install 'trainledger[web]'``. The page computes nothing: it shows what the API returns.
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import MissingDependency

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765

__all__ = ["create_app", "serve", "DEFAULT_HOST", "DEFAULT_PORT"]


def create_app(**kwargs: Any) -> Any:
    from trainledger.web.app import create_app as _create

    return _create(**kwargs)


def loopback_hosts(host: str, port: int) -> list[str] | None:
    """Host headers to accept: on a loopback bind only local names (guards against DNS rebinding)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return ["127.0.0.1", "localhost", "[::1]", "::1"]
    return None


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, log_level: str = "warning") -> None:
    """Run the app until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise MissingDependency("the web app needs fastapi and uvicorn: pip install 'trainledger[web]'") from None
    from trainledger.web.conn import uvicorn_config

    app = create_app(allowed_hosts=loopback_hosts(host, port))
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()
