"""A run executed in this process: ``toren run AGENT`` (and ``toren runs resume``,
``retry``, ``fork``) without ``--url``.

One object, :class:`LocalSession`, owns the whole of it, from open to close:

- :meth:`LocalSession.open`: the runtime (the agents under the root and the store: the
  embedded database, or ``--database-url``);
- :meth:`LocalSession.start`: a new run, refused before it is created when its provider
  cannot be reached from here (no API key);
- :meth:`LocalSession.follow`: a worker in this process that runs only that run, and the
  live view until the run ends or parks (:func:`toren.cli.follow.follow`);
- :meth:`LocalSession.close`: the worker drained (a step in flight may finish) and its
  lease given back, then the runtime closed.

The command calls it straight down; nothing here calls back up into the command."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from toren.cli._common import database_url_for, settings_from
from toren.cli.backend import EmbeddedBackend
from toren.cli.follow import follow
from toren.client import Run
from toren.runtime import Runtime, close_runtime, open_runtime

__all__ = ["INTERACTIVE_DRAIN", "LocalSession"]

# How long an interrupted `toren run` lets a running step finish before giving it back.
INTERACTIVE_DRAIN = 2.0


class LocalSession:
    """The runtime, the backend over its store and the worker of one foreground run."""

    def __init__(self, runtime: Runtime, *, reach: str = "") -> None:
        self.runtime = runtime
        self.backend = EmbeddedBackend(runtime)
        # The options a printed follow-up command needs to reach these runs
        # (:func:`toren.cli._common.follow_up_options`).
        self.reach = reach
        self._closed = False

    @classmethod
    async def open(
        cls,
        root: Path,
        *,
        database_url: str | None,
        code_version: str | None,
        reach: str = "",
        create: bool = True,
    ) -> LocalSession:
        """The agents under ``root`` over ``database_url`` (default: the embedded database
        under ``root``). Without ``create`` (commands on existing runs) a missing embedded
        database is :class:`toren.cli._common.NoDatabase`, not a new empty one."""
        root = root.resolve()
        settings = settings_from(database_url=database_url, code_version=code_version)
        url = database_url_for(root, database_url, create=create)
        return cls(await open_runtime(root, url, settings), reach=reach)

    async def __aenter__(self) -> LocalSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(
        self,
        agent: str | None,
        input: object,
        *,
        process: str = "main",
        idempotency_key: str | None = None,
    ) -> Run:
        """Start a run of ``agent`` (``None``: the root's only agent). The run executes
        here, with this environment: a provider it could never reach (no key) is refused
        now, before a run is created, not found blocked later."""
        resolver = self.runtime.resolver
        name = agent or resolver.names()[0]
        resolver.check_ready(name)
        return await self.backend.start_run(
            name, input, process=process, idempotency_key=idempotency_key
        )

    async def follow(self, run_id: str, *, replayed_upto: int | None = None) -> int:
        """Run ``run_id`` on a worker in this process and follow it in the live view until
        it ends or parks; the exit code. ``replayed_upto``: see
        :func:`toren.cli.follow.follow`."""
        await self.backend.start_worker(run_id)
        return await follow(self.backend, run_id, reach=self.reach, replayed_upto=replayed_upto)

    async def close(self) -> None:
        """Drain the worker (up to :data:`INTERACTIVE_DRAIN` for a step in flight), give
        its run back, close the store. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend.stop_worker(INTERACTIVE_DRAIN)
        finally:
            await close_runtime(self.runtime)
