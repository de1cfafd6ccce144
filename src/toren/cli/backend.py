"""The two places a command can talk to: the embedded database (a store opened in this
process) or a server (``--url``, through :mod:`toren.client`). Both give the commands
runs as the client's :class:`~toren.client.Run` (the embedded database's as a
:class:`LocalRun`, which adds the lease as this process sees it), events as plain dicts in
the API's shape, and the same stream of live items:

    ("event", event_dict)   a stored event, in sequence order
    ("delta", item)         a text delta of a model call in progress (best effort)
    ("idle", run)           nothing new for a moment (the view refreshes its spinner)
    ("end", run)            the run is terminal, or parked waiting for a message
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from toren.cli._common import RunFinished
from toren.client import Run
from toren.core.contract.ports import RunStore
from toren.core.contract.values import RunStatus
from toren.core.drivers.fixforward import fork_run, retry_run
from toren.core.drivers.runs import send_message, start_run
from toren.core.drivers.tick import tick
from toren.core.drivers.worker import LocalWorkerRuntime
from toren.errors import RunNotFound
from toren.runtime import Runtime
from toren.store.base import Lease, Release, RunRecord
from toren.store.urls import shown_url

Item: TypeAlias = tuple[str, "dict[str, Any] | Run"]
UNSET: object = object()  # a fork without --input: the source run's input

# A run waiting for a message whose timeout is further away than this is "parked":
# ``toren run`` stops following it and says how to send the message.
PARKED_AFTER = 5.0
POLL = 0.2


@dataclass(frozen=True)
class LocalRun(Run):
    """A run of the embedded database: the client's ``Run`` and the lease as the row holds
    it (``--json`` prints both lease fields; ``foreign_lease``, held by a worker other
    than this process's, only steers the live view)."""

    lease_owner: str | None = None
    lease_expires_at: float | None = None
    foreign_lease: bool = False


def run_json(run: Run) -> dict[str, object]:
    """A run as ``--json`` prints it: the API's shape (``RunRecord.to_dict()``), plus the
    lease fields of a :class:`LocalRun`."""
    data = asdict(run)
    data.pop("foreign_lease", None)
    data["usage"] = {k: str(v) if isinstance(v, Decimal) else v for k, v in data["usage"].items()}
    return data


def parked(run: Run, now: float | None = None) -> bool:
    if run.status != RunStatus.WAITING or not run.waiting_for:
        return False
    now = time.time() if now is None else now
    return run.not_before is None or float(run.not_before) - now > PARKED_AFTER


def finished(run: Run) -> bool:
    return run.terminal or parked(run)


def as_dict(value: Any) -> dict[str, Any]:
    """A run or event from either side as a plain dict."""
    if isinstance(value, Mapping):
        return dict(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return dict(model_dump(mode="json"))
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot read {type(value).__name__} as a run or event")


log = logging.getLogger("toren.cli")


class Backend(Protocol):
    async def start_run(
        self, agent: str, input: object, *, process: str, idempotency_key: str | None
    ) -> Run: ...
    async def get_run(self, run_id: str) -> Run: ...
    async def list_runs(
        self, *, status: str | None, agent: str | None, limit: int
    ) -> list[Run]: ...
    async def events(self, run_id: str, *, after: int = 0) -> list[dict[str, Any]]: ...
    async def send(self, run_id: str, name: str, payload: object) -> None: ...
    async def cancel(self, run_id: str) -> Run: ...
    async def retry(
        self, run_id: str, *, max_steps: int | None, max_cost_usd: float | None
    ) -> Run: ...
    async def fork(self, run_id: str, *, at: str, input: object) -> Run: ...
    def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Item]: ...
    async def close(self) -> None: ...


# -- embedded ---------------------------------------------------------------------------


class EmbeddedBackend:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.worker: LocalWorkerRuntime | None = None
        self._run_id: str | None = None

    async def start_run(
        self, agent: str, input: object, *, process: str, idempotency_key: str | None
    ) -> Run:
        run = await start_run(
            self.store,
            self.runtime.resolver,
            agent,
            input,
            process=process,
            idempotency_key=idempotency_key,
        )
        return Run.from_json(run.to_dict())

    async def _run(self, run_id: str) -> RunRecord:
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(
                f"no run with id {run_id!r} in {_where(self.store)}",
                run_id=run_id,
            )
        return run

    async def get_run(self, run_id: str) -> LocalRun:
        run = await self._run(run_id)
        mine = self.worker.worker_id if self.worker is not None else None
        return LocalRun.from_json(
            {
                **run.to_dict(),
                "lease_owner": run.lease_owner,
                "lease_expires_at": run.lease_expires_at,
                "foreign_lease": bool(run.lease_owner) and run.lease_owner != mine,
            }
        )

    async def list_runs(self, *, status: str | None, agent: str | None, limit: int) -> list[Run]:
        runs = await self.store.list_runs(status=status, agent=agent, limit=limit)
        return [Run.from_json(r.to_dict()) for r in runs]

    async def events(self, run_id: str, *, after: int = 0) -> list[dict[str, object]]:
        await self._run(run_id)
        return [e.to_dict() for e in await self.store.load_events(run_id, after_seq=after)]

    async def send(self, run_id: str, name: str, payload: object) -> None:
        run = await self._run(run_id)
        if run.terminal:  # as the HTTP API answers (409 run_finished)
            raise RunFinished(f"run {run_id!r} is {run.status}; it takes no more messages")
        await send_message(self.store, run_id, name, payload)

    async def retry(
        self, run_id: str, *, max_steps: int | None, max_cost_usd: float | None
    ) -> LocalRun:
        await self._run(run_id)
        resolver = self.runtime.resolver
        await retry_run(
            self.store, resolver, run_id, max_steps=max_steps, max_cost_usd=max_cost_usd
        )
        return await self.get_run(run_id)

    async def fork(self, run_id: str, *, at: str, input: Any) -> LocalRun:
        await self._run(run_id)
        extra = {} if input is UNSET else {"input": input}
        run = await fork_run(self.store, self.runtime.resolver, run_id, at=at, **extra)
        return await self.get_run(run.id)

    async def cancel(self, run_id: str) -> LocalRun:
        run = await self.store.request_cancel(run_id, now=time.time())
        if not run.terminal and (
            run.lease_owner is None or (run.lease_expires_at or 0) < time.time()
        ):
            # Nobody holds it: record the cancellation now rather than at the next claim.
            await tick(run_id, self.runtime.deps)
        return await self.get_run(run_id)

    async def start_worker(self, run_id: str) -> LocalWorkerRuntime:
        """A worker in this process that runs only ``run_id``."""
        self._run_id = run_id
        # A copy: the worker stamps its id on the deps it is given.
        deps = dataclasses.replace(self.runtime.deps)
        self.worker = LocalWorkerRuntime(deps, concurrency=1, only=run_id)
        await self.worker.start()
        return self.worker

    async def stop_worker(self, drain_window: float) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop(drain_window=drain_window)
            await self._give_back(worker.worker_id)

    async def _give_back(self, worker_id: str) -> None:
        """A tick that failed outside the agent gives its run back blocked; if even that
        write failed (the database), the lease is left to run out. This process's worker
        is gone now: give the run back, so 'toren runs resume' takes it at once. Best
        effort: the database may still be failing, and then the lease runs out."""
        try:
            run = await self.store.get_run(self._run_id) if self._run_id else None
            if run is not None and not run.terminal and run.lease_owner == worker_id:
                lease = Lease(run.id, worker_id, run.lease_epoch)
                await self.store.release(lease, Release(RunStatus.RUNNING), now=time.time())
        except Exception as exc:  # LeaseLost: another worker took it meanwhile
            log.debug("run %s not given back: %s", self._run_id, exc)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Item]:
        hub = self.runtime.live
        queue = hub.subscribe(run_id)
        last = after
        try:
            while True:
                for event in await self.store.load_events(run_id, after_seq=last):
                    last = event.seq
                    yield "event", event.to_dict()
                run = await self.get_run(run_id)
                if finished(run):
                    # The final events were stored with the status: read them too.
                    for event in await self.store.load_events(run_id, after_seq=last):
                        last = event.seq
                        yield "event", event.to_dict()
                    yield "end", run
                    return
                try:
                    item = await asyncio.wait_for(queue.get(), POLL)
                except TimeoutError:
                    yield "idle", run
                    continue
                while True:  # take every delta that is already there, then read the log
                    if item.get("type") in ("delta", "stalled"):
                        yield item["type"], item
                    try:
                        item = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        break
        finally:
            hub.unsubscribe(run_id, queue)

    async def close(self) -> None:
        await self.stop_worker(0.0)


def _where(store: RunStore) -> str:
    url = getattr(store, "url", "")
    if url.startswith("sqlite:///"):
        return str(Path(url[len("sqlite:///") :]))
    return shown_url(url) or "the database"


# -- remote -----------------------------------------------------------------------------


class RemoteBackend:
    """A Toren server through :class:`toren.client.AsyncTorenClient`."""

    def __init__(self, url: str, token: str | None) -> None:
        from toren.client import AsyncTorenClient

        self.url = url
        self.client = AsyncTorenClient(url, token=token)

    async def start_run(
        self, agent: str, input: object, *, process: str, idempotency_key: str | None
    ) -> Run:
        return await self.client.start_run(
            agent, input, process=process, idempotency_key=idempotency_key
        )

    async def get_run(self, run_id: str) -> Run:
        return await self.client.get_run(run_id)

    async def list_runs(self, *, status: str | None, agent: str | None, limit: int) -> list[Run]:
        page = await self.client.list_runs(status=status, agent=agent, limit=limit)
        return page.runs

    async def events(self, run_id: str, *, after: int = 0) -> list[dict[str, object]]:
        found: list[dict[str, object]] = []
        cursor: int | None = after
        while cursor is not None:
            page = await self.client.events(run_id, after=cursor, limit=500)
            found += [as_dict(e) for e in page.events]
            cursor = page.next_after if page.events else None
        return found

    async def send(self, run_id: str, name: str, payload: object) -> None:
        await self.client.send_message(run_id, name, payload)

    async def cancel(self, run_id: str) -> Run:
        return await self.client.cancel(run_id)

    async def retry(self, run_id: str, *, max_steps: int | None, max_cost_usd: float | None) -> Run:
        return await self.client.retry(run_id, max_steps=max_steps, max_cost_usd=max_cost_usd)

    async def fork(self, run_id: str, *, at: str, input: object) -> Run:
        extra = {} if input is UNSET else {"input": input}
        return await self.client.fork(run_id, at=at, **extra)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Item]:
        """Events and token deltas over SSE (the client resumes a dropped stream)."""
        from toren.client import Delta

        stream = self.client.stream(run_id, after=after, deltas=True)
        try:
            async for item in stream:
                if isinstance(item, Delta):
                    yield "delta", as_dict(item)
                    continue
                event = as_dict(item)
                yield "event", event
                # The stream goes on while a run waits; stop at the wait that is current
                # (a run replayed from the start passes older waits on the way).
                if event.get("type") == "RunWaiting":
                    run = await self.get_run(run_id)
                    later = await self.client.events(run_id, after=int(event["seq"]), limit=1)
                    if parked(run) and not later.events:
                        yield "end", run
                        return
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        yield "end", await self.get_run(run_id)  # the server ends the stream with the run

    async def close(self) -> None:
        await self.client.aclose()
