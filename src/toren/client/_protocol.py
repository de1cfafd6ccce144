"""The client's logic, written once and free of I/O: how each call becomes a request and
its response a typed result, how SSE lines become messages, and how a stream resumes.
The async and sync clients only send what this module builds."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from toren.client._errors import (
    TorenAPIError,
    TorenConnectionError,
    TorenMessageWarning,
    TorenResponseError,
    TorenStreamTimeout,
    TorenTokenError,
)
from toren.client._types import Agent, Delta, Event, EventPage, Run, RunPage
from toren.redact import Redactor, secrets_from_env

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    has_body: bool = False


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{suffix}"


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def start_run(
    agent: str,
    input: Any,
    process: str,
    idempotency_key: str | None,
    flow: Mapping[str, Any] | None = None,
) -> Call[Run]:
    body = _drop_none(
        {"agent": agent, "process": process, "idempotency_key": idempotency_key, **(flow or {})}
    )
    body["input"] = input
    return Call("POST", "/v1/runs", Run.from_json, json=body, has_body=True)


def get_run(run_id: str) -> Call[Run]:
    return Call("GET", _run_path(run_id), Run.from_json)


def list_runs(
    status: str | None, agent: str | None, process: str | None, limit: int, cursor: str | None
) -> Call[RunPage]:
    params = _drop_none(
        {"status": status, "agent": agent, "process": process, "limit": limit, "cursor": cursor}
    )
    return Call(
        "GET",
        "/v1/runs",
        lambda d: RunPage([Run.from_json(r) for r in d["runs"]], d.get("next_cursor")),
        params=params,
    )


def events(run_id: str, after: int, limit: int) -> Call[EventPage]:
    return Call(
        "GET",
        _run_path(run_id, "/events"),
        lambda d: EventPage([Event.from_json(e) for e in d["events"]], d.get("next_after")),
        params={"after": after, "limit": limit},
    )


def send_message(run_id: str, name: str, payload: Any) -> Call[int]:
    return Call(
        "POST",
        _run_path(run_id, "/messages"),
        _message_accepted,
        json={"name": name, "payload": payload},
        has_body=True,
    )


def _message_accepted(data: Any) -> int:
    """The message id; the server's ``warning`` (the run waits for other names) as a
    :class:`TorenMessageWarning` pointing at the caller's ``send_message`` line."""
    if data.get("warning"):
        warnings.warn(str(data["warning"]), TorenMessageWarning, stacklevel=5)
    return int(data["message_id"])


def cancel(run_id: str) -> Call[Run]:
    return Call("POST", _run_path(run_id, "/cancel"), Run.from_json)


def retry(run_id: str, max_steps: int | None, max_cost_usd: float | None) -> Call[Run]:
    body = _drop_none({"max_steps": max_steps, "max_cost_usd": max_cost_usd})
    return Call("POST", _run_path(run_id, "/retry"), Run.from_json, json=body, has_body=True)


UNSET: Any = object()  # fork without ``input``: the source run's input


def fork(run_id: str, at: str, input: Any) -> Call[Run]:
    body: dict[str, Any] = {"at": at}
    if input is not UNSET:
        body["input"] = input
    return Call("POST", _run_path(run_id, "/fork"), Run.from_json, json=body, has_body=True)


def agents() -> Call[list[Agent]]:
    return Call("GET", "/v1/agents", lambda d: [Agent.from_json(a) for a in d["agents"]])


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/health", dict)


def plan(limit: int | None = None) -> Call[dict[str, Any]]:
    return Call("GET", "/v1/plan", dict, params=_drop_none({"limit": limit}))


def verify(run_id: str) -> Call[dict[str, Any]]:
    return Call("GET", _run_path(run_id, "/verify"), dict)


def invalidations(run_id: str) -> Call[list[dict[str, Any]]]:
    return Call("GET", _run_path(run_id, "/invalidations"), lambda d: list(d["invalidations"]))


def _schedule_path(schedule_id: str, suffix: str = "") -> str:
    agent, _, name = schedule_id.partition("/")
    return f"/v1/schedules/{quote(agent, safe='')}/{quote(name, safe='')}{suffix}"


def schedules() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/schedules", lambda d: list(d["schedules"]))


def get_schedule(schedule_id: str) -> Call[dict[str, Any]]:
    return Call("GET", _schedule_path(schedule_id), dict)


def create_schedule(agent: str, name: str, spec: Mapping[str, Any]) -> Call[dict[str, Any]]:
    body = {**spec, "agent": agent, "name": name}
    return Call("POST", "/v1/schedules", dict, json=body, has_body=True)


def pause_schedule(schedule_id: str, note: str | None, paused: bool) -> Call[dict[str, Any]]:
    path = _schedule_path(schedule_id, "/pause" if paused else "/resume")
    return Call("POST", path, dict, json=_drop_none({"note": note}), has_body=True)


def trigger_schedule(schedule_id: str) -> Call[Run]:
    return Call("POST", _schedule_path(schedule_id, "/trigger"), Run.from_json)


def backfill_schedule(schedule_id: str, start: str, end: str) -> Call[dict[str, Any]]:
    body = {"start": start, "end": end}
    return Call("POST", _schedule_path(schedule_id, "/backfill"), dict, json=body, has_body=True)


def delete_schedule(schedule_id: str) -> Call[None]:
    return Call("DELETE", _schedule_path(schedule_id), lambda d: None)


def needs_tls(base_url: str) -> bool:
    """Plain ``http://`` needs no certificate store: skipping it saves ~30 ms per client
    (loading the CA bundle), which adds up with many short-lived clients. Safe because
    the clients never follow redirects, so an http client never opens a TLS connection."""
    return not base_url.lower().startswith("http://")


def auth_headers(token: str | None) -> dict[str, str]:
    check_token(token)
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_token(token: str | None) -> None:
    """A token is one line of visible ASCII, as the server requires. Anything else would
    fail inside the HTTP library with the header (token and all) in its message, called a
    connection problem; this says what is wrong, where, and never quotes it."""
    if not token:
        return
    for i, char in enumerate(token, 1):
        if "\x21" <= char <= "\x7e":
            continue
        if char in "\r\n":
            what = "a line break"
        elif char.isascii():
            what = "a space or control character"
        else:
            what = "a non-ASCII character"
        raise TorenTokenError(
            f"the API token contains {what} (character {i} of {len(token)}); a token is "
            "visible ASCII on one line. Check --token / TOREN_API_TOKEN (a trailing newline "
            "from a file, a pasted quote?); nothing was sent"
        )


def redactor(token: str | None) -> Redactor:
    """What a client scrubs from the errors it raises: its own token, the values of its
    process's credential-like environment variables and key-shaped strings, exactly as the
    server scrubs responses. An error quotes the server (or a proxy, or an older server)
    verbatim, and error messages end up in logs and tracebacks."""
    return Redactor([token or "", *secrets_from_env(os.environ)])


def result(call: Call[T], response: httpx.Response, redact: Redactor) -> T:
    raise_for_status(response, redact)
    if response.status_code == 204:  # No Content (a deleted schedule)
        return call.parse(None)
    what = f"{call.method} {call.path}"
    media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise unexpected(
            redact,
            response,
            f"the answer to {what} is not JSON ({media or 'no Content-Type'})",
        )
    try:
        return call.parse(response.json())
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, ArithmeticError) as exc:
        problem = f"{type(exc).__name__}: {exc}"[:200]
        raise unexpected(
            redact, response, f"the answer to {what} is not what the Toren API sends ({problem})"
        ) from None


def unexpected(redact: Redactor, response: httpx.Response, problem: str) -> TorenResponseError:
    return TorenResponseError(
        response.status_code,
        redact.text(
            f"{problem}, from {response.request.url.copy_with(query=None)}; is a proxy, a "
            "login portal or another service answering there instead of a Toren server?"
        ),
    )


def raise_for_status(response: httpx.Response, redact: Redactor) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
        details = error.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500] or response.reason_phrase, None
    raise api_error(redact, response.status_code, code, message, details)


def api_error(
    redact: Redactor, status: int, code: str, message: str, details: Any = None
) -> TorenAPIError:
    return TorenAPIError(status, code, redact.text(message), redact(details))


def connection_error(redact: Redactor, message: str) -> TorenConnectionError:
    return TorenConnectionError(redact.text(message))


class StreamAttempts:
    """The reconnect budget of one ``stream()`` call. Every way a connection can end
    before the run's ``end`` (a broken connection, silence past ``stream_timeout``, an
    early close, a 200 that is no event stream) counts; a message received resets it.
    Past ``max_reconnects`` the last problem is raised, typed by what happened."""

    def __init__(self, run_id: str, max_reconnects: int, redact: Redactor) -> None:
        self.run_id = run_id
        self.max_reconnects = max_reconnects
        self.redact = redact
        self.failures = 0

    def progressed(self) -> None:
        self.failures = 0

    def failed(self, problem: TorenAPIError) -> float:
        """Count a failure; raise ``problem`` past the budget, else return the delay."""
        self.failures += 1
        if self.failures > self.max_reconnects:
            raise problem
        return backoff(self.failures)

    def broken(self, state: StreamState, exc: Exception) -> TorenAPIError:
        where = f"the stream of run {self.run_id!r} (last event {state.last})"
        attempts = f"{self.failures + 1} times in a row"
        if isinstance(exc, httpx.ReadTimeout):
            return TorenStreamTimeout(
                self.redact.text(f"{where} sent nothing, not even a heartbeat, {attempts}")
            )
        return connection_error(self.redact, f"{where} broke {attempts}: {exc!r}")

    def closed(self, state: StreamState) -> TorenAPIError:
        return connection_error(
            self.redact,
            f"the server closed the stream of run {self.run_id!r} before its end "
            f"{self.failures + 1} times in a row (last event {state.last})",
        )

    def not_a_stream(self, response: httpx.Response) -> TorenAPIError:
        media = response.headers.get("content-type", "") or "no Content-Type"
        return unexpected(
            self.redact,
            response,
            f"the stream of run {self.run_id!r} answered HTTP {response.status_code} with "
            f"{media}, not text/event-stream, {self.failures + 1} times in a row",
        )


def is_event_stream(response: httpx.Response) -> bool:
    media = str(response.headers.get("content-type", "")).partition(";")[0].strip().lower()
    return media == "text/event-stream"


# -- Server-Sent Events -------------------------------------------------------------------


@dataclass
class SSEMessage:
    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class SSEParser:
    """Incremental ``text/event-stream`` parser: feed it lines without their newline."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> SSEMessage | None:
        if not line:
            if not self._data and not self._event:
                return None
            msg = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return msg
        if line.startswith(":"):
            return None  # a comment: the server's heartbeat
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None


class StreamState:
    """Where a run's stream is: the last seq delivered, and whether it ended. A reconnect
    asks for what follows ``last`` (``Last-Event-ID``), so each event arrives once."""

    def __init__(self, run_id: str, after: int, deltas: bool, redact: Redactor) -> None:
        self.run_id = run_id
        self.redact = redact
        self.last = after
        self.deltas = deltas
        self.done = False
        self.final: Run | None = None

    def request(self) -> tuple[str, dict[str, Any], dict[str, str]]:
        headers = {"Accept": "text/event-stream"}
        if self.last:
            headers["Last-Event-ID"] = str(self.last)
        return _run_path(self.run_id, "/stream"), {"after": self.last}, headers

    def handle(self, msg: SSEMessage) -> Event | Delta | None:
        try:
            return self._handle(msg)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TorenResponseError(
                200,
                self.redact.text(
                    f"a {msg.event!r} message of the stream of run {self.run_id!r} is not "
                    f"what the Toren API sends ({type(exc).__name__}: {exc})"[:300]
                ),
            ) from None

    def _handle(self, msg: SSEMessage) -> Event | Delta | None:
        if msg.event == "event":
            event = Event.from_json(json.loads(msg.data))
            if event.seq <= self.last:
                return None  # already delivered (defensive: the server never repeats)
            self.last = event.seq
            return event
        if msg.event == "delta":
            return Delta.from_json(json.loads(msg.data)) if self.deltas else None
        if msg.event == "end":
            run = json.loads(msg.data).get("run")
            final = Run.from_json(run) if run else None
            if final is not None and not final.terminal:
                # Not the end: the run was retried after the terminal event an older
                # server ended on. The connection closes; the next one reads on from
                # ``last``, past that event.
                return None
            self.done = True
            self.final = final
            return None
        if msg.event == "error":
            error = json.loads(msg.data).get("error", {})
            self.done = True
            raise api_error(
                self.redact,
                200,
                str(error.get("code", "stream_error")),
                str(error.get("message", "")),
            )
        return None


def backoff(failures: int) -> float:
    return float(min(0.1 * 2 ** max(failures - 1, 0), 2.0))
