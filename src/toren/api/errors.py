"""One JSON error shape for every failure: ``{"error": {"code", "message"}}``.

Toren's exceptions map to status codes by branch of the error tree; anything unexpected is
a 500 with a generic message (logged server-side with its traceback, never sent).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from toren.errors import (
    AgentNotFound,
    IdempotencyConflict,
    InvalidInput,
    RunNotFound,
    TorenError,
    UserError,
)

log = logging.getLogger("toren.api")

STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    501: "not_implemented",
    503: "not_ready",
}


class ApiError(HTTPException):
    """An error the API raises itself, with its own code."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(status, message)
        self.code = code
        self.message = message
        self.details = details


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            "body_too_large",
            f"the request body is larger than the limit of {limit} bytes",
        )


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def status_for(exc: TorenError) -> int:
    if isinstance(exc, RunNotFound | AgentNotFound):
        return 404
    if isinstance(exc, InvalidInput):
        return 422
    if isinstance(exc, IdempotencyConflict):
        return 409
    if isinstance(exc, UserError):
        return 400
    return 500


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.code, exc.message, exc.details, exc.headers)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's answer to a body that is not UTF-8; malformed JSON is a 422, and so
        # is this: one status for "the body cannot be read".
        return error_response(422, "invalid_request", "the request body is not valid UTF-8 JSON")
    code = STATUS_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route {request.url.path!r}; the API lives under /v1"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path!r}"
    return error_response(exc.status_code, code, message, headers=exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, problems = validation_message(exc.errors())
    return error_response(422, "invalid_request", message, problems)


def validation_message(errors: Iterable[Any]) -> tuple[str, list[dict[str, str]]]:
    """Pydantic errors of a request as the API words them: one message and the problems.
    The CLI checks its arguments against the same request models and says the same."""
    problems = [_problem(e) for e in errors]
    message = "; ".join(f"{p['where']}: {p['message']}" for p in problems) or "invalid request"
    return message, problems


def _problem(error: Any) -> dict[str, str]:
    loc = [str(part) for part in error.get("loc", ())]
    where = ".".join(loc) or "request"
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "string_pattern_mismatch" and loc[-1:] in (["agent"], ["process"]):
        from toren.api.models import NAME_HELP

        message = f"{_quote(error.get('input'))} is not a valid name; use {NAME_HELP}"
    elif error.get("type") == "string_pattern_mismatch" and loc[-1:] == ["name"]:
        from toren.api.models import MESSAGE_NAME_HELP

        message = (
            f"{_quote(error.get('input'))} is not a valid message name; use {MESSAGE_NAME_HELP}"
        )
    return {"where": where, "message": message, "type": str(error.get("type", ""))}


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _on_toren_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TorenError)
    status = status_for(exc)
    if status == 500:
        return await _on_unexpected(request, exc)
    return error_response(status, exc.code, exc.message)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return internal_error_response()


def internal_error_response() -> JSONResponse:
    return error_response(
        500, "internal_error", "the server failed to handle this request; see its logs"
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(TorenError, _on_toren_error)
    # Anything else is caught by ``middleware.CatchAll``, which answers with
    # ``internal_error_response``: no traceback ever reaches a client.
