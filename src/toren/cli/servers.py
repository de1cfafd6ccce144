"""The long-running commands: ``toren dev`` (worker + API + console, reloading agent code
on change), ``toren serve`` (API + console) and ``toren worker`` (a production worker)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.markup import escape

from toren.cli._common import (
    database_url_for,
    deprecated_flag,
    err,
    examples,
    fail,
    out,
    run_async,
    settings_from,
    setup_logging,
)
from toren.core.contract.values import RunStatus
from toren.core.drivers.live import ALL
from toren.core.drivers.scheduler import Scheduler
from toren.core.drivers.tick import TickDeps
from toren.core.drivers.upkeep import WorkerMetrics
from toren.core.drivers.worker import LocalWorkerRuntime
from toren.durations import parse_duration
from toren.errors import InvalidInput, MissingProviderKey, TorenError
from toren.runtime import Runtime, close_runtime, open_runtime, sqlite_url_for
from toren.store.urls import shown_url

if TYPE_CHECKING:
    from toren.api.state import InProcessWorker

F = TypeVar("F", bound=Callable[..., object])

log = logging.getLogger("toren.cli")

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False)


def log_level_option(default: str) -> Callable[[F], F]:
    """``--log-level``: one of the five level names (env ``TOREN_LOG_LEVEL``)."""
    return click.option(
        "--log-level", type=LOG_LEVELS, default=default, envvar="TOREN_LOG_LEVEL", show_default=True
    )


def allowed_hosts_option(fn: F) -> F:
    """``--allowed-host``: the Host names the server answers to (DNS-rebinding guard)."""
    return click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        envvar="TOREN_ALLOWED_HOSTS",
        help="A Host name the server answers to (repeat, or comma-separate; '*' for any, "
        "'.example.com' for a domain). Default: the loopback names when bound to loopback, "
        "any host otherwise (a token is then required). [env: TOREN_ALLOWED_HOSTS]",
    )(fn)


def _allowed_hosts(given: Sequence[str], host: str, tokens: Sequence[str]) -> tuple[str, ...]:
    from toren.api.hosts import default_allowed_hosts, normalize_host, rebindable

    names = [n.strip() for raw in given for n in raw.split(",") if n.strip()]
    for name in names:
        normalize_host(name)  # a bad entry fails here, before anything starts
    named = [n for n in names if rebindable(n)]
    if named and not any(tokens):
        err().print(
            f"[yellow]warning:[/] --allowed-host {', '.join(named)} on a server without a "
            "token: a web page whose DNS name is allowed can rebind that name to this "
            "address and call the API from the browser (DNS rebinding). Set a token "
            "(TOREN_API_TOKEN), or allow only IP addresses and localhost"
        )
    return tuple(names) if names else default_allowed_hosts(host, tokens)


def agents_and_database(fn: F) -> F:
    """The --agents and --database-url options of the long-running commands."""
    fn = click.option(
        "--database-url",
        envvar="TOREN_DATABASE_URL",
        default=None,
        help="Database URL (default: <agents>/.toren/toren.db). [env: TOREN_DATABASE_URL]",
    )(fn)
    return click.option(
        "--agents",
        "agents_root",
        default=".",
        envvar="TOREN_AGENTS",
        show_default=True,
        type=click.Path(path_type=Path),
        help="Agents root. [env: TOREN_AGENTS]",
    )(fn)


def _setup_logging(level: str, secrets: Sequence[str] = ()) -> None:
    setup_logging(level, secrets)


def _stop_on_signals(stop: asyncio.Event) -> Callable[[], None]:
    """SIGINT/SIGTERM set ``stop``; returns the function that removes the handlers."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror}", _bind_hint(exc, port))


def _bind_hint(exc: OSError, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"another process uses the port; pick another with --port (e.g. --port {port + 1})"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's; use --host 127.0.0.1 (or 0.0.0.0)"
    if exc.errno == errno.EACCES:
        return "ports below 1024 need privileges; pick another with --port (e.g. --port 8000)"
    return "check --host and --port"


def _create_app(
    runtime: Runtime,
    tokens: Sequence[str],
    worker: InProcessWorker | None,
    console: bool,
    allowed_hosts: Sequence[str],
) -> Any:
    from toren.api.app import create_app

    return create_app(
        runtime.store,
        runtime.resolver,
        tokens=tuple(tokens),
        live=runtime.live,
        runtime=worker,
        console=console,
        allowed_hosts=tuple(allowed_hosts),
    )


class WorkerSwitch:
    """What the API sees as "the worker" in ``toren dev``: whichever worker runs now (each
    reload starts a new one), an :class:`toren.api.state.InProcessWorker`. Between two
    workers (or with no agent yet) it executes nothing: no runs, no metrics, and the deps
    of the runtime."""

    def __init__(self, runtime: Runtime, worker: LocalWorkerRuntime | None = None) -> None:
        self.runtime = runtime
        self.current = worker
        self._idle = WorkerMetrics()
        self._idle_scheduler = Scheduler(
            runtime.store.schedules, runtime.deps.clock, runtime.deps.agents
        )

    @property
    def deps(self) -> TickDeps:
        return self.current.deps if self.current is not None else self.runtime.deps

    @property
    def metrics(self) -> WorkerMetrics:
        return self.current.metrics if self.current is not None else self._idle

    @property
    def scheduler(self) -> Scheduler:
        return self.current.scheduler if self.current is not None else self._idle_scheduler

    @property
    def active_runs(self) -> list[str]:
        return self.current.active_runs if self.current is not None else []

    def cancel_local(self, run_id: str) -> bool:
        return self.current.cancel_local(run_id) if self.current is not None else False


# -- toren dev --------------------------------------------------------------------------


@click.command(
    help="Develop an agent: one process running a worker, the HTTP API and the web console "
    "on SQLite under DIR/.toren/, bound to 127.0.0.1. Edits to the agent's files reload it: "
    "a new code version, and runs in flight continue under the new code (steps that still "
    "match are replayed for free; the first one that changed is honestly invalidated and "
    "re-run). Ctrl-C drains and exits."
    + examples(
        "toren dev",
        "toren dev examples/support-agent --port 8080",
        "curl -s localhost:8000/v1/runs -H 'content-type: application/json' "
        '-d \'{"agent": "hello", "input": "Hi"}\'',
    )
)
@click.argument("directory", default=".", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--port",
    default=8000,
    show_default=True,
    envvar="TOREN_PORT",
    type=click.IntRange(0, 65535),
    help="Port of the API and console on 127.0.0.1. [env: TOREN_PORT]",
)
@click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="Fixed code version (default: a hash of the agent's code, new on every edit of a "
    "file it may read; README, docs and tests do not count). "
    "[env: TOREN_CODE_VERSION]",
)
@click.option(
    "--database-url",
    default=None,
    help="Database URL (default: SQLite in DIR/.toren/toren.db), e.g. a PostgreSQL "
    "database to develop against the backend production uses. Flag only: a "
    "TOREN_DATABASE_URL in the shell is not read, so a development loop never writes to "
    "a production database by accident.",
)
@click.option("--no-console", is_flag=True, help="Serve the API only.")
@allowed_hosts_option
@log_level_option("warning")
def dev(
    directory: Path,
    port: int,
    code_version: str | None,
    database_url: str | None,
    no_console: bool,
    allowed_hosts: tuple[str, ...],
    log_level: str,
) -> None:
    host = "127.0.0.1"
    hosts = _allowed_hosts(allowed_hosts, host, ())
    _setup_logging(log_level)
    _check_port(host, port)
    run_async(
        lambda: _dev(
            directory.resolve(),
            host,
            port,
            code_version,
            not no_console,
            hosts,
            log_level,
            database_url,
        )
    )


async def _dev(
    root: Path,
    host: str,
    port: int,
    code_version: str | None,
    console: bool,
    allowed_hosts: Sequence[str] = (),
    log_level: str = "warning",
    database_url: str | None = None,
) -> None:
    from toren.api.server import running_server

    settings = settings_from(code_version=code_version)
    runtime = await open_runtime(root, database_url or sqlite_url_for(root), settings)
    printer = out()
    stop = asyncio.Event()
    remove_handlers = _stop_on_signals(stop)
    switch = WorkerSwitch(runtime)
    reporter: asyncio.Task[None] | None = None
    try:
        versions = _agent_versions(runtime)
        if versions is not None:
            switch.current = await _start_worker(runtime)
        app = _create_app(runtime, (), switch, console, allowed_hosts)
        async with running_server(app, host, port, log_level=log_level.lower()) as server:
            printer.print(f"[bold]toren dev[/] · agents in {escape(str(root))}")
            if versions == {}:
                err().print(
                    f"[yellow]warning:[/] no agent in {escape(str(root))}: no agent.yaml here "
                    "nor in its subdirectories. Create one with [bold]toren init[/] (or save "
                    "an agent.yaml: toren dev picks it up)",
                    highlight=False,
                )
            reporter = asyncio.ensure_future(report_runs(runtime))
            for name, (_, version) in sorted((versions or {}).items()):
                printer.print(f"  agent [cyan]{escape(name)}[/] code version {escape(version)}")
                _warn_not_ready(runtime, name)
            printer.print(f"  API      {server.url}/v1   (OpenAPI: {server.url}/v1/openapi.json)")
            if console:
                printer.print(f"  console  {server.url}/")
            printer.print(f"  database {escape(shown_url(runtime.settings.database_url))}")
            printer.print("[dim]watching for changes · Ctrl-C to stop[/]")
            await _watch(root, runtime, switch, versions or {}, stop)
            printer.print("stopping: draining the worker…")
    finally:
        remove_handlers()
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(BaseException):
                await reporter
        if switch.current is not None:
            await switch.current.stop()
        await close_runtime(runtime)
    printer.print("stopped")


async def report_runs(runtime: Runtime) -> None:
    """One line per run started (through the API) and per run that ended, parked or got
    blocked, from the live feed of this process's API and worker."""
    printer = out()
    queue = runtime.live.subscribe()
    try:
        while True:
            item = await queue.get()
            line = run_line(item)
            if line is not None:
                printer.print(line, highlight=False)
    finally:
        runtime.live.unsubscribe(ALL, queue)


_ENDED: dict[str, str] = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.WAITING: "cyan",
}


def run_line(item: dict[str, Any]) -> str | None:
    run_id = escape(str(item.get("run_id")))
    kind = item.get("type")
    if kind == "created":
        return f"[bold]▶[/] run {run_id} started (agent {escape(str(item.get('agent')))})"
    if kind == "status" and item.get("status") in _ENDED:
        status = str(item["status"])
        return f"[{_ENDED[status]}]■[/] run {run_id} {status}"
    if kind == "stalled":
        error = item.get("error") or {}
        return f"[red]■[/] run {run_id} blocked: {escape(str(error.get('message')))}"
    return None


def _warn_not_ready(runtime: Runtime, name: str) -> None:
    """Say at once what would refuse every run of the agent (a model with no key)."""
    try:
        runtime.resolver.check_ready(name)
    except MissingProviderKey as exc:
        err().print(
            f"[yellow]warning:[/] {escape(exc.message)}; its runs are refused until it is set",
            highlight=False,
        )
    except TorenError:
        pass  # a broken agent is reported by the reload


def _agent_versions(runtime: Runtime) -> dict[str, tuple[str, str]] | None:
    """Agent name -> (content hash, code version), or None (with the error printed) when
    an agent is broken. The content hash decides a reload, also under a fixed
    ``--code-version``; it counts only the files the code version depends on
    (:func:`toren.agents.loader.is_code_path`), so a README edit reloads nothing."""
    try:
        return {
            name: (definition.content_hash, definition.code_version)
            for name in runtime.resolver.names()
            for definition in [runtime.resolver.load(name)]
        }
    except TorenError as exc:
        err().print(f"[bold red]error:[/] {escape(exc.message)}")
        err().print("[dim]hint:[/] fix it and save: toren dev reloads (no runs execute until then)")
        return None


async def _start_worker(runtime: Runtime) -> LocalWorkerRuntime:
    worker = LocalWorkerRuntime(runtime.reload_deps())
    await worker.start()
    return worker


async def _drain_for_reload(worker: LocalWorkerRuntime, runtime: Runtime) -> None:
    """The drain a deploy gets: steps in flight (a model call already paid for) finish and
    are recorded under the old code version, then the new worker replays them for free.
    Cutting them off would send the identical request again and lose the first one's cost."""
    if worker.active_runs:
        out().print(
            f"[dim]reloading: letting {len(worker.active_runs)} run(s) finish the step in "
            f"flight (up to {runtime.settings.drain_window:.0f}s)…[/]"
        )
    await worker.stop(drain_window=runtime.settings.drain_window)


async def _watch(
    root: Path,
    runtime: Runtime,
    switch: WorkerSwitch,
    versions: dict[str, tuple[str, str]],
    stop: asyncio.Event,
) -> None:
    from watchfiles import Change, awatch

    def code_change(_: Change, path: str) -> bool:
        return runtime.resolver.is_code_change(path)

    printer = out()
    async for changes in awatch(root, watch_filter=code_change, stop_event=stop, debounce=200):
        names = sorted({Path(p).relative_to(root).as_posix() for _, p in changes})
        current = _agent_versions(runtime)
        if current is None:
            if switch.current is not None:
                await _drain_for_reload(switch.current, runtime)
                switch.current = None
            continue
        if current == versions and switch.current is not None:
            continue  # the same code (an edit undone, a file saved unchanged)
        started = time.monotonic()
        if switch.current is not None:
            await _drain_for_reload(switch.current, runtime)
        switch.current = await _start_worker(runtime)
        changed = [
            f"{n} {versions[n][1] if n in versions else '-'} → {v}"
            for n, (h, v) in current.items()
            if versions.get(n, ("", ""))[0] != h
        ]
        versions.clear()
        versions.update(current)
        printer.print(
            f"[yellow]reloaded[/] ({escape(', '.join(names[:5]))}"
            f"{'…' if len(names) > 5 else ''}): {escape('; '.join(changed) or 'agents reloaded')} "
            f"[dim]{(time.monotonic() - started) * 1000:.0f} ms[/]"
        )


# -- toren serve ------------------------------------------------------------------------


@click.command(
    help="Serve the HTTP API and the web console (no worker: run 'toren worker' beside it). "
    "It refuses to listen beyond loopback without a token."
    + examples(
        "toren serve",
        "TOREN_API_TOKEN=$(openssl rand -hex 24) toren serve --host 0.0.0.0 --port 8080",
        "toren serve --database-url postgresql://toren@db/toren --agents ./agents",
    )
)
@click.option("--host", default="127.0.0.1", show_default=True, envvar="TOREN_HOST")
@click.option(
    "--port", default=8000, show_default=True, envvar="TOREN_PORT", type=click.IntRange(0, 65535)
)
@click.option(
    "--token",
    "tokens",
    multiple=True,
    envvar="TOREN_API_TOKEN",
    help="Accepted bearer token (repeat, or comma-separate, for several; required off "
    "loopback). Prefer TOREN_API_TOKEN or --token-file: a token given as a flag shows in "
    "the process list. [env: TOREN_API_TOKEN]",
)
@click.option(
    "--token-file",
    envvar="TOREN_API_TOKEN_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A file of accepted bearer tokens, one per line (or comma-separated), added to "
    "those of --token / TOREN_API_TOKEN. [env: TOREN_API_TOKEN_FILE]",
)
@agents_and_database
@click.option("--no-console", is_flag=True, help="Serve the API only.")
@allowed_hosts_option
@click.option(
    "--keep-alive",
    type=click.FloatRange(1, 86_400),
    default=75.0,
    show_default=True,
    envvar="TOREN_KEEP_ALIVE",
    help="Seconds an idle client connection stays open. Keep it above the idle timeout of "
    "whatever connects (a load balancer's: the AWS module sets its ALB's plus 5), or "
    "requests sent as the server closes are dropped. [env: TOREN_KEEP_ALIVE]",
)
@log_level_option("info")
def serve(
    host: str,
    port: int,
    tokens: tuple[str, ...],
    token_file: Path | None,
    agents_root: Path,
    database_url: str | None,
    no_console: bool,
    allowed_hosts: tuple[str, ...],
    keep_alive: float,
    log_level: str,
) -> None:
    flagged = click.get_current_context().get_parameter_source("tokens")
    given = list(tokens)
    if token_file is not None:
        given += token_file.read_text(encoding="utf-8").splitlines()
    tokens = tuple(t.strip() for raw in given for t in raw.split(",") if t.strip())
    from toren.api.server import check_bind, check_tokens

    check_tokens(tokens)
    check_bind(host, tokens)
    hosts = _allowed_hosts(allowed_hosts, host, tokens)
    # After the tokens are parsed: each one is a secret of its own in every log line
    # (the access log prints a request's path and query, where a token may be).
    _setup_logging(log_level, tokens)
    if tokens and flagged == click.core.ParameterSource.COMMANDLINE:
        err().print(
            "[yellow]warning:[/] --token on the command line shows in the process list "
            "(ps, /proc) to every user of this machine; set TOREN_API_TOKEN or use "
            "--token-file instead"
        )
    _check_port(host, port)
    root = agents_root.resolve()
    url = database_url_for(root, database_url)
    run_async(
        lambda: _serve(root, url, host, port, tokens, not no_console, hosts, log_level, keep_alive)
    )


async def _serve(
    root: Path,
    url: str,
    host: str,
    port: int,
    tokens: Sequence[str],
    console: bool,
    allowed_hosts: Sequence[str] = (),
    log_level: str = "info",
    keep_alive: float | None = None,
) -> None:
    from toren.api.server import KEEP_ALIVE, url_for
    from toren.api.server import serve as serve_app

    runtime = await open_runtime(root, url, settings_from(database_url=url))
    try:
        app = _create_app(runtime, tokens, None, console, allowed_hosts)
        base = url_for(host, port)
        out().print(
            f"toren serve · API {base}/v1"
            + (f" · console {base}/" if console else "")
            + ("" if tokens else " · no token: loopback only")
        )
        # --log-level reaches uvicorn (info and up: the access log); its lines go through
        # Toren's handler (setup_logging), hence no logging config of uvicorn's own.
        await serve_app(
            app,
            host,
            port,
            log_level=log_level.lower(),
            log_config=None,
            timeout_keep_alive=keep_alive or KEEP_ALIVE,
        )
    finally:
        await close_runtime(runtime)


# -- toren worker -----------------------------------------------------------------------


@click.command(
    help="Run a worker: claim runs from the database, execute them, renew leases, and on "
    "SIGTERM or Ctrl-C drain (stop claiming, let running steps finish for up to the drain "
    "window, then give the rest back). Run as many as you like against one PostgreSQL."
    + examples(
        "toren worker",
        "TOREN_DATABASE_URL=postgresql://toren@db/toren toren worker --concurrency 50",
        "toren worker --drain-window 60 --code-version $(git rev-parse HEAD)",
    )
)
@agents_and_database
@click.option(
    "--concurrency",
    envvar="TOREN_CONCURRENCY",
    default=None,
    type=click.IntRange(1),
    help="Runs executed at once (default 100). [env: TOREN_CONCURRENCY]",
)
@click.option(
    "--drain-window",
    envvar="TOREN_DRAIN_WINDOW",
    default=None,
    type=click.FloatRange(0),
    help="Seconds running steps get to finish on stop (default 30). [env: TOREN_DRAIN_WINDOW]",
)
@click.option(
    "--drain-timeout",
    "drain_timeout_deprecated",
    default=None,
    type=click.FloatRange(0),
    hidden=True,
    help="Deprecated spelling of --drain-window.",
)
@click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="Code version, e.g. the image's git SHA (default: the agent directory's hash). "
    "[env: TOREN_CODE_VERSION]",
)
@click.option(
    "--worker-id",
    envvar="TOREN_WORKER_ID",
    default=None,
    help="A stable id for this worker (e.g. the host or pod name). A worker restarted "
    "under the same id takes its dead predecessor's runs back at once instead of waiting "
    "for their leases to expire. Never give two live workers the same id. "
    "[env: TOREN_WORKER_ID]",
)
@click.option(
    "--retention",
    envvar="TOREN_RETENTION",
    default=None,
    help="Prune runs that finished this long ago (30d, 12h, ...), a small batch at a "
    "time, while working (default: keep every run). [env: TOREN_RETENTION]",
)
@log_level_option("info")
def worker(
    agents_root: Path,
    database_url: str | None,
    concurrency: int | None,
    drain_window: float | None,
    drain_timeout_deprecated: float | None,
    code_version: str | None,
    worker_id: str | None,
    retention: str | None,
    log_level: str,
) -> None:
    # SIGTERM/SIGINT from here on ask for a clean stop, even before the event loop runs
    # (a deploy may stop a worker that is still starting): noted, honoured once it can be.
    early_stop = _EarlyStop.install()
    if drain_timeout_deprecated is not None:
        deprecated_flag("--drain-timeout")
        drain_window = drain_window if drain_window is not None else drain_timeout_deprecated
    _setup_logging(log_level)
    root = agents_root.resolve()
    url = database_url_for(root, database_url)
    settings = settings_from(
        database_url=url,
        code_version=code_version,
        concurrency=concurrency,
        drain_window=drain_window,
    )
    if retention is not None and retention.strip().lower() not in ("", "off", "none"):
        try:
            after = parse_duration(retention)
        except InvalidInput as exc:
            raise click.BadParameter(str(exc), param_hint="'--retention'") from None
        settings = settings.with_(retention=replace(settings.retention, finished_after=after))
    run_async(lambda: _worker(root, settings, worker_id, early_stop))


class _EarlyStop:
    """SIGTERM/SIGINT before the worker's event loop installs its own handlers."""

    def __init__(self) -> None:
        self.requested = False

    @classmethod
    def install(cls) -> _EarlyStop:
        early = cls()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (embedded use)
                signal.signal(sig, early._note)
        return early

    def _note(self, signum: int, frame: object) -> None:
        self.requested = True


def _queue_metric(runtime: Runtime) -> Any:
    """On AWS (``TOREN_DEPLOYMENT`` set by the task definition), publish the queue depth
    that worker autoscaling follows."""
    deployment = os.environ.get("TOREN_DEPLOYMENT")
    if not deployment:
        return None
    from toren.adapters.aws.queue_metric import QueueDepthPublisher

    publisher = QueueDepthPublisher(runtime.store, deployment)
    publisher.start()
    log.info("publishing Toren/QueueDepth for deployment %s", deployment)
    return publisher


async def _worker(
    root: Path, settings: object, worker_id: str | None = None, early: _EarlyStop | None = None
) -> None:
    stop = asyncio.Event()
    remove_handlers = _stop_on_signals(stop)
    if early is not None and early.requested:
        stop.set()
    noted = asyncio.ensure_future(_log_stop_request(stop))
    try:
        await _serve_worker(root, settings, worker_id, stop)
    except Exception as exc:
        if not stop.is_set():
            raise
        # Asked to stop while starting (the database was still out of reach, say): the
        # operator wants it gone, and nothing was claimed. A clean exit.
        log.info("worker stopped while starting (%s)", exc)
    finally:
        noted.cancel()
        remove_handlers()


async def _log_stop_request(stop: asyncio.Event) -> None:
    await stop.wait()
    log.info("worker: stop requested")


async def _serve_worker(
    root: Path, settings: Any, worker_id: str | None, stop: asyncio.Event
) -> None:
    log.info("worker starting: opening %s", shown_url(settings.database_url))
    runtime = await open_runtime(root, settings.database_url, settings)
    try:
        if stop.is_set():
            log.info("worker stopped while starting")
            return
        names = runtime.resolver.names()
        if not names:
            fail(
                f"no agents in {root}",
                "point --agents (TOREN_AGENTS) at an agent directory or a directory of them",
            )
        for name in names:
            runtime.resolver.load(name)  # a broken agent fails here, not in every tick
        if worker_id:
            runtime.deps.worker_id = worker_id
        worker = LocalWorkerRuntime(runtime.deps)
        await worker.start()
        if stop.is_set():  # asked to stop while registering: drain what it may have claimed
            log.info("worker %s stopped while starting", worker.worker_id)
            await worker.stop()
            return
        publisher = _queue_metric(runtime)
        log.info(
            "worker %s serving %s (code version %s) on %s, concurrency %d, drain window %.0fs",
            worker.worker_id,
            ", ".join(names),
            worker.code_version,
            shown_url(runtime.settings.database_url),
            worker.concurrency,
            runtime.settings.drain_window,
        )
        await stop.wait()
        log.info("worker %s draining", worker.worker_id)
        if publisher is not None:
            await publisher.stop()
        await worker.stop()
    finally:
        await close_runtime(runtime)
