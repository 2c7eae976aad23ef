"""The console's ASGI app: the HTTP API under ``/api/v1`` (OpenAPI at ``/api/openapi.json``,
docs at ``/api/docs``), the web page at ``/``, its static files (htmx, vendored) at
``/static``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.staticfiles import StaticFiles

from console.http import api, errors, pages
from ledger import Ledger

__all__ = ["SECURITY_HEADERS", "STATIC", "create_app"]


STATIC = Path(__file__).resolve().parents[1] / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def create_app(ledger: Ledger) -> FastAPI:
    """The console for ``ledger`` (its engine and settings; every request authenticates)."""
    app = FastAPI(title="onward", version="1", openapi_url="/api/openapi.json",
                  docs_url="/api/docs", redoc_url=None,
                  description="Operators and services act on onward runs. Every route needs "
                              "`Authorization: Bearer <token>` (onward tokens create).")
    app.state.ledger = ledger
    errors.install(app)
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def security_headers(request: Request,
                               call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            if name == "Cache-Control" and request.url.path.startswith("/static"):
                continue
            response.headers.setdefault(name, value)
        return response

    return app
