"""``toren run`` and ``toren runs ...``: start, follow, inspect and steer runs, against the
embedded database (default) or a server (``--url``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import functools
import json
import shlex
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.markup import escape
from rich.table import Table

from toren.cli._common import (
    EXIT_OK,
    NoDatabase,
    err,
    examples,
    follow_up_options,
    out,
    parse_payload,
    read_input,
    remember_command,
    run_async,
)
from toren.cli.backend import Backend, RemoteBackend, run_json
from toren.cli.follow import follow
from toren.cli.session import LocalSession
from toren.cli.view import RunView, money, next_try, short
from toren.client import Run, TorenMessageWarning
from toren.core.contract.values import STATUSES, RunStatus
from toren.core.drivers.runs import MAX_RUNS_PAGE, unexpected_message
from toren.core.drivers.takeover import gone_in, take_over_gone
from toren.errors import AgentConfigError

F = TypeVar("F", bound=Callable[..., object])
T = TypeVar("T")


def backend_options(fn: F) -> F:
    """Where runs live: a server (--url) or the embedded database under --agents."""
    for option in reversed(
        [
            click.option(
                "--url",
                envvar="TOREN_API_URL",
                default=None,
                help="Talk to a Toren server at this URL instead of the embedded database. "
                "[env: TOREN_API_URL]",
            ),
            click.option(
                "--token",
                envvar="TOREN_API_TOKEN",
                default=None,
                help="Bearer token for --url. [env: TOREN_API_TOKEN]",
            ),
            click.option(
                "--agents",
                "agents_root",
                envvar="TOREN_AGENTS",
                default=".",
                show_default=True,
                type=click.Path(path_type=Path),
                help="Agent directory, or a directory of agent directories; the embedded "
                "database is <agents>/.toren/toren.db. [env: TOREN_AGENTS]",
            ),
            click.option(
                "--database-url",
                envvar="TOREN_DATABASE_URL",
                default=None,
                help="Database instead of the embedded one: sqlite:///path.db or "
                "postgresql://... [env: TOREN_DATABASE_URL]",
            ),
        ]
    ):
        fn = option(fn)

    @functools.wraps(fn)
    def remembered(*args: object, **kwargs: object) -> object:
        remember_command()
        return fn(*args, **kwargs)

    return remembered  # type: ignore[return-value]


@contextlib.asynccontextmanager
async def open_backend(
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> AsyncIterator[Backend]:
    if url:
        remote = RemoteBackend(url, token)
        try:
            yield remote
        finally:
            await remote.close()
        return
    # These commands read or steer existing runs: a missing database is not created.
    async with await LocalSession.open(
        agents_root, database_url=database_url, code_version=None, create=False
    ) as session:
        yield session.backend


def on_backend(
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
    action: Callable[[Backend], Awaitable[T]],
) -> T:
    """Open the backend (a server with --url, else the embedded database), do one thing."""

    async def go() -> T:
        async with open_backend(url, token, agents_root, database_url) as backend:
            return await action(backend)

    return run_async(go)


def printed_as_json(run: Run, as_json: bool) -> bool:
    """With --json, print the run (in the API's shape) and say so."""
    if as_json:
        click.echo(json.dumps(run_json(run), indent=2, ensure_ascii=False))
    return as_json


def locate_agent(
    agent: str, agents_root: Path, *, root_given: bool = False
) -> tuple[Path, str | None]:
    """AGENT as (agents root, name); a ``None`` name means "the agent of that directory".

    The rule (docs/cli.md, "Which agent, which database"): ``--agents`` given (flag or
    ``TOREN_AGENTS``) always wins: AGENT is an agent of that root (a name, or a path to
    one of its agent directories) and runs in the root's database. Without it, a path to
    an agent directory (or its agent.yaml), also a bare name that is a directory here, is
    its own root with its own ``.toren/``; anything else is a name under the default root.
    (A path given with ``--agents`` that is not one of its agents is its own root too.)
    When that directory is also an agent of the current directory, whose database exists
    (a ``toren dev`` here reads it), a warning says where the run goes instead."""
    path = Path(agent)
    if path.name == "agent.yaml" and path.is_file():
        path = path.parent
    bare = "/" not in agent and "\\" not in agent and not agent.startswith(".")
    if root_given:
        if bare:
            return agents_root.resolve(), agent
        dirs = _agent_dirs(agents_root)
        mine = [name for name, where in dirs.items() if path.is_dir() and where == path.resolve()]
        if mine:
            return agents_root.resolve(), mine[0]
    if path.is_dir():
        if not (path / "agent.yaml").is_file():
            raise AgentConfigError(
                f"{path.resolve()}: found a directory without agent.yaml; expected an agent "
                "directory (create one with 'toren init') or an agent name"
            )
        own = path.resolve()
        if bare:
            _warn_other_database(own, agents_root)
        return own, None
    if not bare:
        raise AgentConfigError(
            f"{path}: found nothing (no such file or directory); expected an agent directory "
            "or an agent name"
        )
    return agents_root.resolve(), agent


def _warn_other_database(own: Path, agents_root: Path) -> None:
    """``toren run NAME`` took the directory NAME as its own project: say so when the
    agents root also has that agent and a database, whose runs these will not be."""
    root = agents_root.resolve()
    theirs = root / ".toren" / "toren.db"
    if root == own or not theirs.is_file():
        return
    names = [name for name, where in _agent_dirs(root).items() if where == own]
    if not names:
        return
    _warn(
        f"running the directory {own} as its own project: its runs go to "
        f"{own / '.toren' / 'toren.db'}, not to {theirs} (the database of {root}, where "
        f"this agent is {names[0]!r}); to run it there: "
        f"toren run {names[0]} --agents {shlex.quote(str(agents_root))}"
    )


def _agent_dirs(root: Path) -> dict[str, Path]:
    """The agents of ``root`` by name (none when it is not a directory, or its agent
    files are broken: loading the agent says what is wrong, with its file)."""
    from toren.agents import DirectoryResolver

    if not root.is_dir():
        return {}
    try:
        return {
            name: where.resolve() for name, where in DirectoryResolver(root).agent_dirs().items()
        }
    except AgentConfigError:
        return {}


def _warn(text: str) -> None:
    err().print(f"[yellow]warning:[/] {escape(text)}", highlight=False)


def _single_name(root: Path) -> str:
    from toren.agents import DirectoryResolver

    return DirectoryResolver(root).names()[0]


# -- toren run --------------------------------------------------------------------------


@click.command(
    help="Start a run of AGENT and follow it live: steps as they happen, model text as it "
    "streams, tool calls, tokens and cost. AGENT is a path to an agent directory or the "
    "name of an agent under --agents. Without --url the run executes in this process "
    "against the embedded database (<agent dir>/.toren/toren.db).\n\n"
    "Exit codes: 0 completed, 1 failed, 3 cancelled, 4 waiting for a message (the run "
    "stays waiting), 5 error, 130 interrupted (continue with 'toren runs resume ID')."
    + examples(
        'toren run . "What is the weather in Paris?"',
        'toren run examples/support-agent --input \'{"message": "Where is A-17?"}\'',
        "toren run support-agent --process triage --input @request.json",
        "toren run support-agent --url http://127.0.0.1:8000 --detach",
    )
)
@click.argument("agent")
@click.argument("message", required=False)
@click.option(
    "--input",
    "input_",
    default=None,
    metavar="JSON|@FILE",
    help="Run input as JSON, or @file.json (@- reads stdin). MESSAGE is a plain-string input.",
)
@click.option("--process", default="main", show_default=True, help="Process of the agent.")
@click.option("--idempotency-key", default=None, help="Start at most one run per key.")
@click.option("--detach", is_flag=True, help="Start the run, print its id and return.")
@click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="Code version recorded on events (default: the agent directory's hash). "
    "[env: TOREN_CODE_VERSION]",
)
@backend_options
def run(
    agent: str,
    message: str | None,
    input_: str | None,
    process: str,
    idempotency_key: str | None,
    detach: bool,
    code_version: str | None,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    value = read_input(input_, message)
    if url:
        name = agent
        path = Path(agent)
        if path.is_dir() and (path / "agent.yaml").is_file():
            name = _single_name(path.resolve())
        reach = follow_up_options()
        code = run_async(
            lambda: _run_remote(url, token, name, value, process, idempotency_key, detach, reach)
        )
    else:
        source = click.get_current_context().get_parameter_source("agents_root")
        given = source not in (None, click.core.ParameterSource.DEFAULT)
        root, name_or_none = locate_agent(agent, agents_root, root_given=given)
        code = run_async(
            lambda: _run_embedded(
                root,
                name_or_none,
                value,
                process,
                idempotency_key,
                detach,
                database_url,
                code_version,
                follow_up_options(root),
            )
        )
    raise SystemExit(code)


async def _run_remote(
    url: str,
    token: str | None,
    name: str,
    value: object,
    process: str,
    key: str | None,
    detach: bool,
    reach: str,
) -> int:
    async with open_backend(url, token, Path("."), None) as backend:
        run = await backend.start_run(name, value, process=process, idempotency_key=key)
        if detach:
            _print_detached(run, reach, remote=True)
            return EXIT_OK
        return await follow(backend, run.id, resume_hint=False, reach=reach)


async def _run_embedded(
    root: Path,
    name: str | None,
    value: object,
    process: str,
    key: str | None,
    detach: bool,
    database_url: str | None,
    code_version: str | None,
    reach: str,
) -> int:
    async with await LocalSession.open(
        root, database_url=database_url, code_version=code_version, reach=reach
    ) as session:
        run = await session.start(name, value, process=process, idempotency_key=key)
        if detach:
            _print_detached(run, reach, remote=False)
            return EXIT_OK
        return await session.follow(run.id)


def _print_detached(run: Run, reach: str, *, remote: bool) -> None:
    run_id = escape(run.id)
    click.echo(run.id)
    resume = f"[bold]toren runs resume {run_id}{escape(reach)}[/]"
    hint = (
        f"follow it with {resume}"
        if remote
        else f"a running 'toren dev' or 'toren worker' executes it; or run it here with {resume}"
    )
    from toren.cli._common import err

    err().print(f"started run {run_id} ({escape(run.status)}); {hint}")


# -- toren runs -------------------------------------------------------------------------


@click.group(
    help="Inspect and steer runs: list, show, events, send, cancel, resume, retry, fork; "
    "check them (verify); keep the database small (prune, export, import). The "
    "subcommands that inspect and steer work on the embedded database (default) or a "
    "server (--url); verify, prune, export and import work on the database itself "
    "(--database-url, or the embedded one), like a backup. --json for scripting: every "
    "subcommand but resume and export (which writes JSON lines already)."
    + examples(
        "toren runs list --status waiting",
        "toren runs show run_0193... --json | jq .usage",
        "toren runs events run_0193... --json > events.jsonl",
        "toren runs send run_0193... human '\"approved\"'",
    )
)
def runs() -> None:
    pass


def stuck_rows(run: Run) -> list[tuple[str, str]]:
    """Why an unfinished run does not move: blocked on an infrastructure error (with the
    attempts and the next try), or held by a worker's lease (until when)."""
    rows = []
    blocked = run.blocked
    if blocked:
        error = blocked.get("error") or {}
        rows.append(("blocked", f"[bold red]blocked:[/] {escape(str(error.get('message')))}"))
        rows.append(
            (
                "attempts",
                f"{blocked.get('attempts')} since {_when(blocked.get('since'))}; next try "
                f"{next_try(blocked.get('retry_at'))}",
            )
        )
    queue = run.queue
    if queue and run.status == RunStatus.QUEUED:
        rows.append((RunStatus.QUEUED.value, escape(str(queue.get("reason")))))
    paced = run.rate_limit
    if paced and run.status == RunStatus.WAITING:
        rows.append(("rate limit", escape(str(paced.get("reason")))))
    lease = run.lease
    if lease and not run.terminal:
        rows.append(
            (
                "held by",
                f"worker {escape(str(lease.get('worker')))} until "
                f"{_clock(lease.get('expires_at'))}",
            )
        )
    return rows


def _clock(ts: Any) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OSError):
        return "-"


def _when(ts: Any) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OSError):
        return ""


_STATUS_STYLE: dict[str, str] = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.WAITING: "cyan",
    RunStatus.RUNNING: "magenta",
    RunStatus.QUEUED: "dim",
}


@runs.command(
    "list",
    help="List runs, newest first."
    + examples(
        "toren runs list",
        "toren runs list --status failed --agent support-agent --limit 100",
        "toren runs list --json | jq -r '.[].id'",
    ),
)
@click.option(
    "--status",
    type=click.Choice([s.value for s in STATUSES]),  # values: click takes members by name
    default=None,
    help="Only runs with this status.",
)
@click.option("--agent", default=None, help="Only runs of this agent.")
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=click.IntRange(1, MAX_RUNS_PAGE),
    help=f"At most this many runs (1 to {MAX_RUNS_PAGE}, the HTTP API's page size limit).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@backend_options
def list_runs(
    status: str | None,
    agent: str | None,
    limit: int,
    as_json: bool,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    try:
        found = on_backend(
            url,
            token,
            agents_root,
            database_url,
            lambda backend: backend.list_runs(status=status, agent=agent, limit=limit),
        )
    except NoDatabase as exc:
        if as_json:
            click.echo("[]")
        else:
            out().print(f"no runs yet: there is no database at {escape(str(exc.path))}")
        return
    if as_json:
        click.echo(json.dumps([run_json(r) for r in found], indent=2, ensure_ascii=False))
        return
    console = out()
    if not found:
        console.print("no runs")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=26)
    table.add_column("agent", no_wrap=True)
    for column in ("status", "steps", "cost", "created"):
        table.add_column(column)
    for r in found:
        agent_name = r.agent
        if r.process != "main":
            agent_name += f"/{r.process}"
        style = _STATUS_STYLE.get(r.status, "")
        status = f"[{style}]{r.status}[/]" if style else r.status
        if r.blocked:
            status += f" [bold red]blocked ×{r.blocked.get('attempts')}[/]"
        if r.tool_errors:
            status += f" [yellow]{tool_errors(r.tool_errors)}[/]"
        table.add_row(
            r.id,
            agent_name,
            status,
            str(r.usage.steps),
            money(r.usage.cost_usd),
            _when(r.created_at),
        )
    console.print(table)


def tool_errors(count: int) -> str:
    """The list's marker of a run whose tool calls failed (the model saw the errors)."""
    return f"⚠ {count} tool error{'' if count == 1 else 's'}"


@runs.command(
    help="Show one run: status, input, output or error, usage and code version."
    + examples("toren runs show RUN_ID", "toren runs show RUN_ID --json"),
)
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@backend_options
def show(
    run_id: str,
    as_json: bool,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    found = on_backend(
        url, token, agents_root, database_url, lambda backend: backend.get_run(run_id)
    )
    if printed_as_json(found, as_json):
        return
    console = out()
    usage = found.usage
    style = _STATUS_STYLE.get(found.status, "")
    rows = [
        ("run", found.id),
        ("agent", f"{found.agent} (process {found.process})"),
        ("status", f"[{style}]{found.status}[/]" if style else found.status),
        ("created", _when(found.created_at)),
        ("updated", _when(found.updated_at)),
        ("input", escape(short(found.input, 400))),
    ]
    if found.output is not None:
        rows.append(("output", escape(short(found.output, 2000))))
    if found.error:
        error = found.error
        rows.append(("error", escape(f"{error.get('type')}: {error.get('message')}")))
        if error.get("traceback"):
            rows.append(("traceback", escape(str(error["traceback"]).rstrip())))
        if found.status == RunStatus.FAILED:
            rows.append(("retry", escape(f"fix it, then: toren runs retry {found.id}")))
    if found.forked_from:
        lineage = found.forked_from
        rows.append(("forked from", escape(f"run {lineage.get('run_id')} at {lineage.get('at')}")))
    if found.retries:
        rows.append(("retries", str(found.retries)))
    if found.waiting_for:
        rows.append(("waiting for", escape(", ".join(found.waiting_for))))
    rows += stuck_rows(found)
    rows += [
        ("steps", str(usage.steps)),
        ("tokens", f"{usage.input_tokens} in / {usage.output_tokens} out"),
        ("cost", f"{money(usage.cost_usd)} (estimated)"),
        ("saved by replay", money(usage.saved_by_replay_usd)),
        ("invalidations", str(found.invalidations)),
        ("tool errors", str(found.tool_errors)),
        ("code version", escape(found.code_version or "-")),
    ]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


@runs.command(
    help="Print a run's event log. With --json, one JSON object per line (the HTTP API's "
    "event shape)."
    + examples(
        "toren runs events RUN_ID",
        "toren runs events RUN_ID --json | jq -c 'select(.type == \"StreamInvalidated\")'",
        "toren runs events RUN_ID --after 12 --json",
    ),
)
@click.argument("run_id")
@click.option("--after", default=0, type=click.IntRange(0), help="Only events after this seq.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines.")
@backend_options
def events(
    run_id: str,
    after: int,
    as_json: bool,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    found = on_backend(
        url, token, agents_root, database_url, lambda backend: backend.events(run_id, after=after)
    )
    if as_json:
        for event in found:
            click.echo(json.dumps(event, ensure_ascii=False, separators=(",", ":")))
        return
    console = out()
    view = RunView(console)
    for event in found:
        console.print(f"[dim]#{event.get('seq')} {event.get('type')}[/]", highlight=False)
        view.event(event)


@runs.command(
    help="Send a message to a run (it continues a run waiting in wait_for_message or the "
    "ask_human tool). PAYLOAD is JSON if it parses, else a string; @file reads it. A name "
    "the run is not waiting for is kept for a later wait, with a warning naming the names "
    "it waits for."
    + examples(
        "toren runs send RUN_ID human 'yes, refund it'",
        "toren runs send RUN_ID approval '{\"ok\": true}'",
        "toren runs send RUN_ID approval @answer.json --url http://127.0.0.1:8000",
    ),
)
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the run after sending, as JSON.")
@backend_options
def send(
    run_id: str,
    name: str,
    payload: str | None,
    as_json: bool,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    value = parse_payload(payload)
    check_message(name, value)

    async def send_then_get(backend: Backend) -> Run:
        with warnings.catch_warnings():  # the client's warning: said below, in CLI words
            warnings.simplefilter("ignore", TorenMessageWarning)
            await backend.send(run_id, name, value)
        return await backend.get_run(run_id)

    found = on_backend(url, token, agents_root, database_url, send_then_get)
    waits = found.waiting_for if found.status == RunStatus.WAITING else None
    warning = unexpected_message(run_id, name, waits)
    if warning is not None:
        _warn(warning)
    if printed_as_json(found, as_json):
        return
    where = "" if url else " (or let a running 'toren dev' / 'toren worker' pick it up)"
    reach = follow_up_options(agents_root)
    out().print(
        f"sent {escape(repr(name))} to run {escape(run_id)} ({found.status}); "
        f"continue it with [bold]toren runs resume {escape(run_id)}{escape(reach)}[/]"
        f"{escape(where)}"
    )


def check_message(name: str, payload: object) -> None:
    """The HTTP API's rule for a message (its request model), checked before sending to
    either backend: a name the server would refuse is refused locally too, in its words."""
    from pydantic import ValidationError

    from toren.api.errors import validation_message
    from toren.api.models import SendMessageRequest

    try:
        SendMessageRequest.model_validate({"name": name, "payload": payload})
    except ValidationError as exc:
        raise click.UsageError(validation_message(exc.errors())[0]) from None


@runs.command(
    help="Cancel a run. Agent code sees RunCancelledSignal at its next step; the run ends "
    "'cancelled'."
    + examples("toren runs cancel RUN_ID", "toren runs cancel RUN_ID --url http://127.0.0.1:8000"),
)
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@backend_options
def cancel(
    run_id: str,
    as_json: bool,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    found = on_backend(
        url, token, agents_root, database_url, lambda backend: backend.cancel(run_id)
    )
    if printed_as_json(found, as_json):
        return
    if found.status == RunStatus.CANCELLED:
        out().print(f"run {escape(run_id)} cancelled")
    elif found.terminal:
        out().print(f"run {escape(run_id)} had already {found.status}; nothing to cancel")
    else:
        out().print(
            f"cancellation of run {escape(run_id)} requested; the worker running it stops "
            "it at its next heartbeat"
        )


@runs.command(
    help="Continue a run in this process and follow it until it ends. Use it for a run "
    "whose 'toren run' was interrupted or killed: when its old worker died, the run is "
    "taken over once that worker's lease expires (TOREN_LEASE_TTL, 30s by default). "
    "With --url, follows the run on the server (whose workers continue it).\n\n"
    "Exit codes as for 'toren run'."
    + examples("toren runs resume RUN_ID", "toren runs resume RUN_ID --url http://127.0.0.1:8000"),
)
@click.argument("run_id")
@click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="Code version recorded on new events. [env: TOREN_CODE_VERSION]",
)
@backend_options
def resume(
    run_id: str,
    code_version: str | None,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    reach = follow_up_options(agents_root)
    if url:

        async def remote() -> int:
            async with open_backend(url, token, agents_root, None) as backend:
                await backend.get_run(run_id)
                return await follow(backend, run_id, resume_hint=False, reach=reach)

        raise SystemExit(run_async(remote))
    raise SystemExit(
        run_async(lambda: _resume_embedded(run_id, agents_root, database_url, code_version, reach))
    )


async def _resume_embedded(
    run_id: str,
    agents_root: Path,
    database_url: str | None,
    code_version: str | None,
    reach: str,
) -> int:
    async with await LocalSession.open(
        agents_root, database_url=database_url, code_version=code_version, reach=reach, create=False
    ) as session:
        found = await session.backend.get_run(run_id)
        if found.terminal:
            out().print(f"run {escape(run_id)} already {found.status}")
            return await follow(session.backend, run_id, reach=reach)
        owner, expires = found.lease_owner, found.lease_expires_at
        if owner and expires and float(expires) > time.time():
            runtime = session.runtime
            heartbeat = runtime.settings.lease.heartbeat
            # A holder killed a moment ago on this host is gone once its last heartbeat
            # is two intervals old: wait that out (at most two heartbeats), not its lease.
            soon = await gone_in(runtime.store, str(owner), now=time.time(), heartbeat=heartbeat)
            if soon is not None and soon > 0:
                out().print(
                    f"run {escape(run_id)} is held by worker {escape(str(owner))}, whose "
                    f"process on this host no longer exists; taking it over once its last "
                    f"heartbeat is two intervals old (in {soon:.1f}s)"
                )
                await asyncio.sleep(soon + 0.05)
            freed = dict(
                await take_over_gone(runtime.store, me="", now=time.time(), heartbeat=heartbeat)
            )
            if owner in freed:
                out().print(
                    f"run {escape(run_id)} was held by worker {escape(str(owner))}, which is "
                    f"gone ({escape(freed[owner])}): taking it over now"
                )
            else:
                until = _clock(expires)
                out().print(
                    f"run {escape(run_id)} is held by worker {escape(str(owner))} until "
                    f"{until}; waiting for its lease to expire "
                    f"({float(expires) - time.time():.0f}s) unless that worker finishes it first"
                )
        return await session.follow(run_id)
