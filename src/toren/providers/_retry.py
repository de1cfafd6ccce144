"""Toren's own retry loop for model calls, shared by every vendor provider.

The vendor SDK clients are built with ``max_retries=0`` so that this is the only retry
layer: one policy (:class:`~toren.providers.base.RetryPolicy`), one place that honours
``Retry-After``, an injectable sleep and jitter draw (tests assert the delays instead of
waiting them), a timeout per attempt, and one translation of failures into
:class:`~toren.errors.ModelCallFailed` that never carries credentials or headers.

An attempt is retried only until the provider starts to answer (a success status, the
response headers of a stream): from then on the provider is generating, and billing, so
a failure mid-answer is final, as it is in the vendor SDKs, whose retries also end at
the response headers. Retrying it would pay for the call again (and again: a stream
longer than the timeout would fail on every attempt).

The usage a provider reported during an attempt (Anthropic's ``message_start`` gives the
input tokens before any text; OpenAI may send usage chunks) rides on the failure, as
``details["usage"]`` ``{input_tokens, output_tokens}``: billed tokens must reach cost
accounting and budgets even when the call fails. An attempt that reported usage had got
an answer, and such an attempt is never retried, so that usage is all the call billed.
A call cancelled from outside after such a report raises
:class:`~toren.providers.base.CancelledWithUsage` (a ``CancelledError``) carrying it.

Invariant: a :class:`ModelCallFailed` raised here is what the engine records and replay
re-raises, so its message and details must be plain, serialisable and secret-free.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import math
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from toren.core.contract.ratelimit import PACED, Throttled
from toren.errors import ModelCallFailed
from toren.providers.base import CancelledWithUsage, RetryPolicy, Usage
from toren.redact import Redactor

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Rand = Callable[[], float]  # a draw in [0, 1), as random.random


class MalformedResponse(Exception):
    """The server answered, but not in the shape its API promises. Never retried: the
    same server would most likely answer the same way again."""

    def __init__(self, message: str, *, status: int | None) -> None:
        super().__init__(message)
        self.status = status


def parsed(build: Callable[[], T], *, status: int) -> T:
    """Run a response parser, reporting its ``ValueError`` as a :class:`MalformedResponse`."""
    try:
        return build()
    except ValueError as exc:
        raise MalformedResponse(str(exc), status=status) from exc


class StreamBroken(Exception):
    """A stream failed after the provider had begun to answer. Never retried (see the
    module docstring). ``cause`` is the SDK's or transport's exception."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Attempt:
    """One attempt's progress. A provider calls :meth:`began` once the provider has
    accepted the request and started to answer; the attempt's deadline then no longer
    applies (the SDK's read timeout still bounds every silence of the stream). It calls
    :meth:`used` whenever the provider reports usage, so a failure after that carries it."""

    def __init__(self, deadline: asyncio.Timeout) -> None:
        self._deadline = deadline
        self.usage: Usage | None = None

    def used(self, usage: Usage) -> None:
        """The usage reported so far: running totals, not an increment."""
        self.usage = usage

    def began(self) -> None:
        self._deadline.reschedule(None)


async def decoded(items: AsyncIterator[T], *, status: int) -> AsyncGenerator[T, None]:
    """Pass a begun stream's items through: decode errors become :class:`MalformedResponse`,
    any other failure of the stream a :class:`StreamBroken`. Only errors of the stream
    itself: an exception raised by the consumer (``on_delta``) is not thrown in here, so
    it stays what it is."""
    try:
        async for item in items:
            yield item
    except Exception as exc:
        raise _stream_failure(exc, status) from exc


def _stream_failure(exc: Exception, status: int) -> Exception:
    if isinstance(exc, (MalformedResponse, StreamBroken)):
        return exc
    if isinstance(exc, ValueError):
        return MalformedResponse(str(exc), status=status)
    return StreamBroken(exc)


class _Headers(Protocol):
    def get(self, key: str) -> str | None: ...


class _Response(Protocol):
    headers: _Headers


class _StatusError(Protocol):
    """What the OpenAI and Anthropic SDKs' ``APIStatusError`` both provide."""

    status_code: int
    message: str
    body: object
    response: _Response


@dataclass(frozen=True)
class SdkErrors:
    """The exception classes of one vendor SDK that the retry loop understands."""

    status: type[Exception]
    connection: type[Exception]


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt, reduced to what the retry decision and the error need."""

    message: str
    status: int | None
    retryable: bool
    error_type: str
    retry_after: float | None = None
    began: bool = False  # the provider had started to answer


def is_retryable_status(status: int) -> bool:
    """The vendor SDKs' rule: request timeouts, lock timeouts, rate limits, server errors."""
    return status in (408, 409, 429) or status >= 500


def should_retry(status: int, headers: _Headers) -> bool:
    """As the vendor SDKs decide: the server's own ``x-should-retry`` wins over the status."""
    verdict = headers.get("x-should-retry")
    if verdict in ("true", "false"):
        return verdict == "true"
    return is_retryable_status(status)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from ``Retry-After`` in either form HTTP allows: delay seconds, or an
    HTTP-date (seconds from ``now``, default the wall clock). None when absent or
    unreadable, and when it asks for no wait at all: then the backoff applies, as the
    vendor SDKs do, rather than an immediate retry."""
    if value is None:
        return None
    seconds = _number(value)
    if seconds is None:
        seconds = _seconds_until(value.strip(), time.time() if now is None else now)
    return seconds if seconds is not None and seconds > 0 else None


def _number(value: str | None) -> float | None:
    try:
        number = float(value.strip()) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _seconds_until(http_date: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError, OverflowError):  # a year past C's long
        return None
    if when.tzinfo is None:  # an obsolete form without a zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp() - now


def retry_after(headers: _Headers) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms`` (sent by OpenAI-style APIs and
    read first by their SDKs, being the more precise), else ``Retry-After``."""
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None and millis > 0:
        return millis / 1000
    return parse_retry_after(headers.get("retry-after"))


def _body_message(body: object) -> str | None:
    """``error.message`` from either vendor's error envelope."""
    error = body.get("error") if isinstance(body, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    return message if isinstance(message, str) and message else None


def _broken(exc: StreamBroken) -> AttemptFailure:
    cause = exc.cause
    body = getattr(cause, "body", None)
    detail = _body_message(body) or getattr(cause, "message", None) or str(cause) or "no detail"
    kind = _body_type(body) or type(cause).__name__
    return AttemptFailure(
        f"the answer broke off after it had begun ({kind}: {detail}); not retried, "
        "because the provider had accepted the request and may already bill for it",
        None,
        False,
        kind,
        began=True,
    )


def _body_type(body: object) -> str | None:
    """``error.type`` of an in-stream error event (e.g. ``overloaded_error``)."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if isinstance(kind, str) and kind else None


def classify(exc: Exception, errors: SdkErrors, timeout: float) -> AttemptFailure | None:
    """Map an attempt's exception to a failure; ``None`` means "not a call failure"
    (a bug, or an exception from ``on_delta``), which must propagate untouched."""
    kind = type(exc).__name__
    if isinstance(exc, StreamBroken):
        return _broken(exc)
    if isinstance(exc, errors.status):
        err = cast(_StatusError, exc)
        headers = err.response.headers
        return AttemptFailure(
            message=_body_message(err.body) or err.message,
            status=err.status_code,
            retryable=should_retry(err.status_code, headers),
            error_type=kind,
            retry_after=retry_after(headers),
        )
    if isinstance(exc, TimeoutError):
        return AttemptFailure(f"no answer within {timeout:g}s", None, True, kind)
    if isinstance(exc, errors.connection):
        return AttemptFailure(str(exc) or "connection error", None, True, kind)
    if isinstance(exc, MalformedResponse):
        return AttemptFailure(f"malformed response: {exc}", exc.status, False, kind)
    return None


def _hint(failure: AttemptFailure) -> str:
    if failure.status in (401, 403):
        return "Check the API key and base URL the provider was built with."
    if failure.began:
        return "Retry the run if the failure was transient."
    if failure.retryable:
        return "The provider kept failing; retry the run later or raise RetryPolicy.max_attempts."
    if failure.status is not None and 400 <= failure.status < 500:
        return "Check the model name, messages, tools and params of the request."
    return "Check that the base URL points at a server that speaks this provider's API."


@dataclass(frozen=True)
class Retrying:
    """Runs one model call under a :class:`RetryPolicy` for one provider."""

    provider: str
    errors: SdkErrors
    policy: RetryPolicy
    timeout: float
    sleep: Sleep
    secrets: tuple[str, ...] = ()
    rand: Rand = random.random

    async def call(self, model: str, attempt: Callable[[Attempt], Awaitable[T]]) -> T:
        attempts = max(1, self.policy.max_attempts)
        for number in range(1, attempts + 1):
            progress: Attempt | None = None
            try:
                # The SDK's own timeout bounds each read; this bounds the attempt until
                # the provider begins to answer (see Attempt), so a server that accepts
                # the connection and never answers still ends.
                async with asyncio.timeout(self.timeout) as deadline:
                    progress = Attempt(deadline)
                    return await attempt(progress)
            except asyncio.CancelledError:
                # Cut off from outside (a drain, a step timeout) after the provider had
                # begun to bill: the usage it reported must still reach the run's cost.
                if progress is None or progress.usage is None:
                    raise
                raise CancelledWithUsage(progress.usage) from None
            except Exception as exc:
                failure = classify(exc, self.errors, self.timeout)
                if failure is None:
                    raise
                if failure.status == 429 and PACED.get():
                    # A model with a fleet rate limit: the fleet's bucket waits, not this
                    # call alone (toren.core.contract.ratelimit); never recorded.
                    raise Throttled(
                        failure.retry_after,
                        f"{self.provider} rate limited model {model!r} (HTTP 429)",
                    ) from None
                last = number == attempts or not failure.retryable
                wait = None if last else self.delay(failure, number)
                if wait is None:
                    usage = progress.usage if progress is not None else None
                    # No exception chaining: the SDK error holds the request and its
                    # Authorization header, and must not ride along into logs.
                    raise self._failed(failure, model, number, usage) from None
            await self.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def delay(self, failure: AttemptFailure, number: int) -> float | None:
        """Seconds to wait after failed attempt ``number`` (1-based): the server's ask, else
        the jittered backoff. ``None`` when the server asked for longer than
        ``max_retry_after``: the call then fails rather than retry early."""
        if failure.retry_after is None:
            return self.policy.backoff(number - 1, self.rand())
        if self._asks_too_long(failure):
            return None
        return failure.retry_after

    def _asks_too_long(self, failure: AttemptFailure) -> bool:
        return failure.retry_after is not None and failure.retry_after > self.policy.max_retry_after

    def _failed(
        self, failure: AttemptFailure, model: str, attempts: int, usage: Usage | None
    ) -> ModelCallFailed:
        status = f"HTTP {failure.status}" if failure.status is not None else failure.error_type
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        message = (
            f"{self.provider} call to model {model!r} failed ({status}) after {tries}: "
            f"{Redactor(self.secrets).text(failure.message)}. {self._advice(failure)}"
        )
        details: dict[str, object] = {}
        if failure.retry_after is not None:
            details["retry_after"] = failure.retry_after
        if usage is not None:
            details["usage"] = usage.to_dict()
            message += (
                f" Before it failed, the provider reported {usage.input_tokens} input and "
                f"{usage.output_tokens} output tokens for it."
            )
        return ModelCallFailed(
            message,
            provider=self.provider,
            model=model,
            status=failure.status,
            attempts=attempts,
            retryable=failure.retryable,
            error_type=failure.error_type,
            **details,
        )

    def _advice(self, failure: AttemptFailure) -> str:
        if not (failure.retryable and self._asks_too_long(failure)):
            return _hint(failure)
        asked = f"{failure.retry_after:g}s"
        return (
            f"{'Rate limited: t' if failure.status == 429 else 'T'}he server asked to wait "
            f"{asked} before retrying, longer than RetryPolicy.max_retry_after "
            f"({self.policy.max_retry_after:g}s) allows, so the call was not retried early. "
            f"Retry the run after {asked}."
        )
