from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx

from toren.client import _protocol as p
from toren.client._errors import TorenAPIError, TorenConnectionError
from toren.client._types import Agent, Delta, Event, EventPage, Run, RunPage

T = TypeVar("T")


class AsyncTorenClient:
    """An async client for the Toren HTTP API.

    ``token`` is sent as a bearer token. ``timeout`` bounds each request; a stream waits
    up to ``stream_timeout`` for a byte (the server sends heartbeats) before it treats the
    connection as dead and resumes.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        stream_timeout: float = 60.0,
        max_reconnects: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stream_timeout = stream_timeout
        self.max_reconnects = max_reconnects
        self._redact = p.redactor(token)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=p.auth_headers(token),
            timeout=timeout,
            transport=transport,
            verify=p.needs_tls(self.base_url),
        )

    async def __aenter__(self) -> AsyncTorenClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: p.Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json if call.has_body else None,
                headers=call.headers,
            )
        except httpx.TransportError as exc:
            raise p.connection_error(
                self._redact, f"cannot reach {self.base_url}: {exc!r}"
            ) from exc
        return p.result(call, response, self._redact)

    # -- runs -----------------------------------------------------------------------------

    async def start_run(
        self,
        agent: str,
        input: Any = None,
        *,
        process: str = "main",
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> Run:
        """Start a run. ``concurrency_key``/``concurrency_limit``: at most that many runs of
        the key run or wait at once (the rest stay queued; docs/flow-control.md), and
        ``priority`` orders the key's queue (higher first)."""
        flow = {
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
            "priority": priority,
        }
        return await self._send(p.start_run(agent, input, process, idempotency_key, flow))

    async def get_run(self, run_id: str) -> Run:
        return await self._send(p.get_run(run_id))

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        process: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        return await self._send(p.list_runs(status, agent, process, limit, cursor))

    async def events(self, run_id: str, *, after: int = 0, limit: int = 100) -> EventPage:
        return await self._send(p.events(run_id, after, limit))

    async def send_message(self, run_id: str, name: str, payload: Any = None) -> int:
        return await self._send(p.send_message(run_id, name, payload))

    async def cancel(self, run_id: str) -> Run:
        return await self._send(p.cancel(run_id))

    async def retry(
        self, run_id: str, *, max_steps: int | None = None, max_cost_usd: float | None = None
    ) -> Run:
        """Retry a failed run under the code now deployed (``POST /v1/runs/{id}/retry``);
        the limits, if given, are raised for this run."""
        return await self._send(p.retry(run_id, max_steps, max_cost_usd))

    async def fork(self, run_id: str, *, at: str, input: Any = p.UNSET) -> Run:
        """A new run forked from ``run_id`` at ``at`` (``"main:5"``); without ``input``,
        the source's input (``POST /v1/runs/{id}/fork``)."""
        return await self._send(p.fork(run_id, at, input))

    async def agents(self) -> list[Agent]:
        return await self._send(p.agents())

    # -- schedules (docs/schedules.md); a schedule's id is "agent/name" --------------------

    async def schedules(self) -> list[dict[str, Any]]:
        """Every schedule (``GET /v1/schedules``)."""
        return await self._send(p.schedules())

    async def get_schedule(self, schedule_id: str) -> dict[str, Any]:
        """One schedule with its recent runs."""
        return await self._send(p.get_schedule(schedule_id))

    async def create_schedule(self, agent: str, name: str, **spec: Any) -> dict[str, Any]:
        """A schedule made at run time: ``cron=`` or ``every=``, and the other keys of an
        agent.yaml schedule (``zone``, ``input``, ``process``, ``overlap``, ...)."""
        return await self._send(p.create_schedule(agent, name, spec))

    async def pause_schedule(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        return await self._send(p.pause_schedule(schedule_id, note, True))

    async def resume_schedule(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Resume from now: the times it was paused over are not caught up."""
        return await self._send(p.pause_schedule(schedule_id, note, False))

    async def trigger_schedule(self, schedule_id: str) -> Run:
        """Start a run of the schedule now."""
        return await self._send(p.trigger_schedule(schedule_id))

    async def backfill_schedule(self, schedule_id: str, start: str, end: str) -> dict[str, Any]:
        """Start the runs of the nominal times in ``[start, end)`` (ISO 8601 with an
        offset), each at most once: ``{"started": n, "already_ran": m}``."""
        return await self._send(p.backfill_schedule(schedule_id, start, end))

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._send(p.delete_schedule(schedule_id))

    async def health(self) -> dict[str, Any]:
        return await self._send(p.health())

    async def plan(self, limit: int | None = None) -> dict[str, Any]:
        """The replay plan of the server's in-flight runs (``GET /v1/plan``), at most
        ``limit`` of them (the server's maximum by default); ``more`` says if runs were
        left out."""
        return await self._send(p.plan(limit))

    async def verify(self, run_id: str) -> dict[str, Any]:
        """Every digest of the run re-derived by the server (``GET /v1/runs/{id}/verify``)."""
        return await self._send(p.verify(run_id))

    async def invalidations(self, run_id: str) -> list[dict[str, Any]]:
        """What changed at each invalidation of the run (``.../invalidations``)."""
        return await self._send(p.invalidations(run_id))

    async def wait(self, run_id: str, timeout: float = 60.0) -> Run:
        """Until the run is completed, failed or cancelled; ``TimeoutError`` otherwise.
        Connection errors are retried with backoff until ``timeout``; then the last one
        (:class:`TorenConnectionError`) is raised."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        failures = 0
        while True:
            try:
                run = await self.get_run(run_id)
            except TorenConnectionError:
                # A blip (a restarting server, a load balancer) is retried with backoff
                # until the timeout; a server that stays away raises the last error.
                failures += 1
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(p.backoff(failures), max(deadline - time.monotonic(), 0.0)))
                continue
            failures = 0
            if run.terminal:
                return run
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id!r} is still {run.status} after {timeout}s")
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, 1.0)

    # -- streaming ------------------------------------------------------------------------

    async def stream(
        self, run_id: str, *, after: int = 0, deltas: bool = False
    ) -> AsyncIterator[Event | Delta]:
        """The run's events from ``after`` on, live, until the run ends (the terminal
        event of its current attempt: a ``RunFailed`` followed by a ``RunRetried`` is
        not the end). A dropped
        connection is resumed with ``Last-Event-ID``: every event arrives once, in order.
        With ``deltas=True``, token deltas of model calls in flight are yielded too.

        Each connection that ends before the run does (broken, silent for
        ``stream_timeout`` seconds, closed early, or a 200 that is not an event stream)
        counts against ``max_reconnects``; an event resets the count. Past it the stream
        raises :class:`TorenConnectionError`, :class:`TorenStreamTimeout` or
        :class:`TorenResponseError`."""
        state = p.StreamState(run_id, after, deltas, self._redact)
        attempts = p.StreamAttempts(run_id, self.max_reconnects, self._redact)
        while not state.done:
            path, params, headers = state.request()
            try:
                async with self._http.stream(
                    "GET",
                    path,
                    params=params,
                    headers=headers,
                    timeout=httpx.Timeout(self._http.timeout.connect, read=self.stream_timeout),
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        p.raise_for_status(response, self._redact)
                    if not p.is_event_stream(response):
                        problem = attempts.not_a_stream(response)
                    else:
                        parser = p.SSEParser()
                        async for line in response.aiter_lines():
                            msg = parser.feed(line)
                            if msg is None:
                                continue
                            attempts.progressed()
                            item = state.handle(msg)
                            if item is not None:
                                yield item
                            if state.done:
                                return
                        problem = attempts.closed(state)  # closed early (a server stopping)
            except TorenAPIError:
                raise
            except httpx.TransportError as exc:
                problem = attempts.broken(state, exc)
            await asyncio.sleep(attempts.failed(problem))
