"""onward errors as RFC 9457 ``application/problem+json``: the status says what kind of
refusal it was, ``detail`` says what to do (the error's own message)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ledger.exceptions import (
    InvalidInput,
    LedgerUnavailable,
    OnwardError,
    PermissionDenied,
    SchemaMismatch,
    Unauthenticated,
    UnknownApproval,
    UnknownEffect,
    UnknownRun,
    UnknownToken,
)
from tasks.exceptions import WorkflowModuleUnimportable

__all__ = ["PROBLEM", "STATUS", "install", "problem", "status_of", "unreadable_body"]


PROBLEM = "application/problem+json"

STATUS: list[tuple[type[Exception], int, str]] = [
    (Unauthenticated, 401, "not authenticated"),
    (PermissionDenied, 403, "forbidden"),
    (UnknownRun, 404, "not found"),
    (UnknownApproval, 404, "not found"),
    (UnknownEffect, 404, "not found"),
    (UnknownToken, 404, "not found"),
    (InvalidInput, 422, "invalid input"),
    (LedgerUnavailable, 503, "ledger unavailable"),
    # `onward db upgrade` ran under this server: nothing written, restart it on the new code
    (SchemaMismatch, 503, "ledger upgraded"),
    # a module of the server's ONWARD_WORKFLOWS cannot be imported: its configuration
    (WorkflowModuleUnimportable, 500, "workflow module cannot be imported"),
    (OnwardError, 409, "refused"),  # the run's state, an approval's: nothing changed
]


def status_of(exc: Exception) -> tuple[int, str]:
    for kind, status, title in STATUS:
        if isinstance(exc, kind):
            return status, title
    return 500, "internal error"


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="onward"'} if status == 401 else None
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def install(app: FastAPI) -> None:
    """Every error the API answers is a problem document."""

    @app.exception_handler(OnwardError)
    async def onward_error(request: Request, exc: OnwardError) -> JSONResponse:
        status, title = status_of(exc)
        return problem(status, title, str(exc), error=type(exc).__name__)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()]
        return problem(422, "invalid input", "the request does not match the API's schema",
                       errors=errors)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and cause is not None:  # FastAPI could not read the body
            return problem(400, str(exc.detail), unreadable_body(cause))
        return problem(exc.status_code, str(exc.detail), str(exc.detail))


def unreadable_body(cause: BaseException) -> str:
    """Why a request body could not be read as JSON, in words a client can act on."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"the request body is not UTF-8 (byte {cause.start}: {cause.reason}); send "
                "JSON encoded as UTF-8")
    if isinstance(cause, RecursionError):
        return ("the request body nests objects and arrays too deeply to parse; flatten it "
                "(a run's input may nest ONWARD_MAX_JSON_DEPTH levels)")
    return f"the request body is not JSON onward can read: {str(cause)[:200]}"
