"""One JSON error shape for every failure: ``{"error": {"code", "message"}}``.

Toren's exceptions map to status codes by branch of the error tree; anything unexpected is
a 500 with a generic message (logged server-side with its traceback, never sent).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from toren.api.models import CURSOR_HELP, NAME_HELP
from toren.core.contract.inputs import MAX_JSON_DEPTH, MESSAGE_NAME_HELP, text_depth, too_deep
from toren.errors import (
    AgentNotFound,
    ConcurrencyConflict,
    ForkPointNotFound,
    IdempotencyConflict,
    InvalidInput,
    RunNotFound,
    RunNotRetryable,
    ScheduleNotFound,
    TorenError,
    UserError,
)

log = logging.getLogger("toren.api")
INTERNAL_ERROR = "the server failed to handle this request; see its logs"

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

    def __init__(self, status: int, code: str, message: str, details: object = None) -> None:
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
    details: object = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, object] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def status_for(exc: TorenError) -> int:
    if isinstance(exc, RunNotFound | AgentNotFound | ScheduleNotFound):
        return 404
    if isinstance(exc, ForkPointNotFound):
        return 409
    if isinstance(exc, InvalidInput):
        return 422
    if isinstance(exc, IdempotencyConflict | RunNotRetryable | ConcurrencyConflict):
        return 409
    if isinstance(exc, UserError):
        return 400
    return 500


@dataclass(frozen=True)
class Failure:
    """What an error response says, before redaction."""

    status: int
    code: str
    message: str
    details: object = None
    headers: Mapping[str, str] | None = None


def _on_api_error(request: Request, exc: Exception) -> Failure:
    assert isinstance(exc, ApiError)
    return Failure(exc.status_code, exc.code, exc.message, exc.details, exc.headers)


def _on_http_error(request: Request, exc: Exception) -> Failure:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's answer to a body json.loads raised on with something other than a
        # JSONDecodeError; malformed JSON is a 422, and so is this.
        return _unparsable_body(exc.__cause__, getattr(request, "_body", None))
    code = STATUS_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route {request.url.path!r}; the API lives under /v1"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path!r}"
    return Failure(exc.status_code, code, message, headers=exc.headers)


def _unparsable_body(cause: BaseException | None, body: object) -> Failure:
    """``body``: the bytes FastAPI read (Starlette caches them on the request as ``_body``,
    not public API, hence the fallback when they are missing)."""
    if isinstance(cause, RecursionError):
        message = _too_deep_body(body)
    elif isinstance(cause, UnicodeDecodeError):
        message = f"the request body is not valid UTF-8: {cause.reason} at position {cause.start}"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        # Python refuses to parse integers longer than sys.get_int_max_str_digits().
        message = (
            f"the request body holds an integer with more than {sys.get_int_max_str_digits()} "
            "digits; send numbers that large as strings"
        )
    else:
        message = "the request body is not valid UTF-8 JSON"
    return _invalid_body(message, "json_invalid")


# A body field with a nesting limit -> how its errors name it (as the host API does).
_NESTED_FIELDS = {"input": "run input", "payload": "message payload"}


def _too_deep_body(body: object) -> str:
    """JSON too deep for Python's parser, in the words of a value too deep: measured on
    the text, from the ``input`` or ``payload`` field it is in."""
    generic = (
        "the request body nests objects and arrays too deeply to parse; "
        f"send at most {MAX_JSON_DEPTH} levels"
    )
    if not isinstance(body, bytes):
        return generic
    depth, path = text_depth(body.decode("utf-8", "replace"), MAX_JSON_DEPTH + 2)
    field = path[0] if path else None
    if not isinstance(field, str) or field not in _NESTED_FIELDS:
        return generic
    # Levels are counted from the field's value, one below the body's object.
    error = too_deep(_NESTED_FIELDS[field], field, depth - 1, path[1:])
    return f"body.{field}: {error.message}"


def _on_validation_error(request: Request, exc: Exception) -> Failure:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    body = _body_problem(request, errors)
    if body is not None:
        return body
    message, problems = validation_message(errors)
    return Failure(422, "invalid_request", message, problems)


def _body_problem(request: Request, errors: list[Any]) -> Failure | None:
    """A body that is not a JSON object at all gets one message saying what it is and what
    is expected, not pydantic's "Input should be a valid dictionary"."""
    # (A model validator's own error is also at ("body",): a problem of its fields, said
    # in its words by validation_message.)
    whole = [
        e for e in errors if tuple(e.get("loc", ())) == ("body",) and e.get("type") != "value_error"
    ]
    broken = [e for e in errors if e.get("type") == "json_invalid"]
    if not whole and not broken:
        return None
    if whole and whole[0].get("type") == "missing":
        return _invalid_body("the request body is empty; expected a JSON object", "missing")
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        got = f"got {content_type!r}" if content_type else "the request has none"
        return Failure(
            415, "unsupported_media_type", f"expected Content-Type application/json; {got}"
        )
    if broken:
        position = broken[0]["loc"][-1]
        reason = broken[0].get("ctx", {}).get("error", "malformed")
        return _invalid_body(
            f"body is not valid JSON: {reason} at position {position}", "json_invalid"
        )
    kind = _json_kind(whole[0].get("input"))
    return _invalid_body(f"the request body is {kind}; expected a JSON object", "model_type")


def _invalid_body(message: str, type_: str) -> Failure:
    return Failure(
        422, "invalid_request", message, [{"where": "body", "message": message, "type": type_}]
    )


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule for a body it parses as JSON: ``application/json`` or
    ``application/*+json``, parameters (``; charset=utf-8``) aside."""
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _json_kind(value: object) -> str:
    kinds = ((bool, "a boolean"), (str, "a string"), (int | float, "a number"), (list, "an array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def validation_message(errors: Iterable[object]) -> tuple[str, list[dict[str, str]]]:
    """Pydantic errors of a request as the API words them: one message and the problems.
    The CLI checks its arguments against the same request models and says the same."""
    problems = [_problem(e) for e in errors]
    message = "; ".join(f"{p['where']}: {p['message']}" for p in problems) or "invalid request"
    return message, problems


def _problem(error: Any) -> dict[str, str]:
    loc = [str(part) for part in error.get("loc", ())]
    where = ".".join(loc) or "request"
    message = str(error.get("msg", "invalid"))
    kind = error.get("type")
    if kind == "string_pattern_mismatch" and loc[-1:] in (["agent"], ["process"]):
        message = f"{_quote(error.get('input'))} is not a valid name; use {NAME_HELP}"
    elif kind == "string_pattern_mismatch" and loc == ["query", "cursor"]:
        message = f"{_quote(error.get('input'))} is not a cursor; use {CURSOR_HELP}"
    elif kind == "string_pattern_mismatch" and loc[-1:] == ["name"]:
        message = (
            f"{_quote(error.get('input'))} is not a valid message name; use {MESSAGE_NAME_HELP}"
        )
    elif kind == "value_error" and "error" in error.get("ctx", {}):
        message = str(error["ctx"]["error"])  # our validators' own words, unprefixed
    return {"where": where, "message": message, "type": str(kind or "")}


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _on_toren_error(request: Request, exc: Exception) -> Failure:
    assert isinstance(exc, TorenError)
    status = status_for(exc)
    if status == 500:
        return _on_unexpected(request, exc)
    return Failure(status, exc.code, exc.message)


def _on_unexpected(request: Request, exc: Exception) -> Failure:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return Failure(500, "internal_error", INTERNAL_ERROR)


def internal_error_response() -> JSONResponse:
    return error_response(500, "internal_error", INTERNAL_ERROR)


class RelativePaths:
    """Rewrites the server's agent directories out of a message that reaches a client: a
    path under an agents root is named relative to it (``broken/tools.py:2``), the root
    itself is ``.``. Clients learn nothing of the server's file layout; the server's own
    logs and CLI keep absolute paths."""

    def __init__(self, roots: Sequence[str | Path]) -> None:
        # Longest first: a root inside another is rewritten relative to itself.
        found = sorted({str(r) for root in roots for r in (root, Path(root).resolve())}, key=len)
        self._pattern = (
            re.compile(
                "|".join(
                    rf"{re.escape(r.rstrip(os.sep))}(?:{re.escape(os.sep)}|(?![\w.-]))"
                    for r in reversed(found)
                    if r.rstrip(os.sep)
                )
            )
            if found
            else None
        )

    def __call__(self, message: str) -> str:
        if self._pattern is None:
            return message
        return self._pattern.sub(lambda m: "" if m.group().endswith(os.sep) else ".", message)


def install(
    app: FastAPI, redact: Callable[[object], object], paths: Callable[[str], str] = str
) -> None:
    """Answer every error as JSON. Each body passes through ``redact`` (the same redaction
    as runs and events): messages quote what they are about (an agent file's exception, a
    provider's error, the client's own input), and any of those may carry a key. Messages
    pass through ``paths`` first (:class:`RelativePaths`: no absolute agent paths)."""
    handlers: list[tuple[type[Exception], Callable[[Request, Exception], Failure]]] = [
        (ApiError, _on_api_error),
        (HTTPException, _on_http_error),
        (RequestValidationError, _on_validation_error),
        (TorenError, _on_toren_error),
    ]
    for exc_type, describe in handlers:
        app.add_exception_handler(exc_type, _responder(describe, redact, paths))
    # Anything else is caught by ``middleware.CatchAll``, which answers with
    # ``internal_error_response``: no traceback ever reaches a client.


def _responder(
    describe: Callable[[Request, Exception], Failure],
    redact: Callable[[Any], Any],
    paths: Callable[[str], str],
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def respond(request: Request, exc: Exception) -> JSONResponse:
        failure = describe(request, exc)
        return error_response(
            failure.status,
            failure.code,
            redact(paths(failure.message)),
            redact(failure.details),
            failure.headers,
        )

    return respond
