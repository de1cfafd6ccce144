"""``toren runs retry`` and ``toren runs fork``: continue a failed run under the code now
deployed, or start a new run from one step of an existing one (see
:mod:`toren.core.drivers.fixforward` for what each does to the logs)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import click
from rich.markup import escape

from toren.cli._common import examples, follow_up_options, out, parse_payload, run_async
from toren.cli.backend import UNSET, Backend, run_json
from toren.cli.follow import follow, last_seq
from toren.cli.runs import backend_options, open_backend
from toren.cli.session import LocalSession
from toren.client import Run


def _go(
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
    code_version: str | None,
    detach: bool,
    as_json: bool,
    action: Callable[[Backend], Awaitable[Run]],
    *,
    retried: str | None = None,
) -> int:
    """Do ``action`` (which returns the run to follow), then follow that run to its end:
    on the server with --url, else on a worker in this process. With --detach, print it
    and return. ``retried`` is the run the action sets going again: its log is read
    before, so that only the steps recorded before are marked replayed."""
    reach = follow_up_options(agents_root)

    async def before(backend: Backend) -> int | None:
        return await last_seq(backend, retried) if retried and not (detach or as_json) else None

    async def remote() -> int:
        async with open_backend(url, token, agents_root, None) as backend:
            upto = await before(backend)
            run = await action(backend)
            if detach or as_json:
                return _print(run, reach, as_json)
            return await follow(backend, run.id, resume_hint=False, reach=reach, replayed_upto=upto)

    async def embedded() -> int:
        async with await LocalSession.open(
            agents_root,
            database_url=database_url,
            code_version=code_version,
            reach=reach,
            create=False,
        ) as session:
            upto = await before(session.backend)
            run = await action(session.backend)
            if detach or as_json:
                return _print(run, reach, as_json)
            return await session.follow(run.id, replayed_upto=upto)

    return run_async(remote if url else embedded)


def _print(run: Run, reach: str, as_json: bool) -> int:
    if as_json:
        click.echo(json.dumps(run_json(run), indent=2, ensure_ascii=False))
        return 0
    run_id = escape(run.id)
    lineage = run.forked_from
    what = (
        f"forked from run {escape(lineage['run_id'])} at {escape(lineage['at'])}"
        if lineage
        else "queued again"
    )
    out().print(
        f"run {run_id} {what} ({run.status}); follow it with "
        f"[bold]toren runs resume {run_id}{escape(reach)}[/] (a running 'toren dev' or "
        "'toren worker' runs it by itself)"
    )
    return 0


_CODE_VERSION = click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="Code version recorded on new events (embedded database). [env: TOREN_CODE_VERSION]",
)
_DETACH = click.option("--detach", is_flag=True, help="Do it, print the run and return.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the run as JSON and return.")


@click.command(
    help="Retry a failed run under the code now deployed. The run continues from its log: "
    "every recorded successful step replays for free (no model call paid again, no email "
    "sent again); the step whose failure ended the run (a tool that raised, a model call "
    "that failed after its retries, a failed child) runs again live, as does agent code "
    "that raised. A cancelled run is final and cannot be retried; fork it (or a completed "
    "run) instead. --max-steps and --max-cost-usd raise the agent's limits for this run "
    "(never lower them). Without --detach, follows the run like 'toren runs resume'.\n\n"
    "Exit codes as for 'toren run'."
    + examples(
        "toren runs retry RUN_ID",
        "toren runs retry RUN_ID --max-cost-usd 2.50",
        "toren runs retry RUN_ID --url http://127.0.0.1:8000 --detach",
    ),
)
@click.argument("run_id")
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Raise limits.max_steps for this run.",
)
@click.option(
    "--max-cost-usd",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Raise limits.max_cost_usd (USD) for this run.",
)
@_DETACH
@_JSON
@_CODE_VERSION
@backend_options
def retry(
    run_id: str,
    max_steps: int | None,
    max_cost_usd: float | None,
    detach: bool,
    as_json: bool,
    code_version: str | None,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    async def action(backend: Backend) -> Run:
        return await backend.retry(run_id, max_steps=max_steps, max_cost_usd=max_cost_usd)

    raise SystemExit(
        _go(
            url,
            token,
            agents_root,
            database_url,
            code_version,
            detach,
            as_json,
            action,
            retried=run_id,
        )
    )


@click.command(
    help="Fork a run at STREAM:POSITION: a new run whose steps before that position replay "
    "from RUN_ID's log without being paid again (even where the code now asks something "
    "else there: they are the history the fork starts from), and which runs live from "
    "there under the code now deployed. The way to try an edited prompt on a real "
    "conversation. RUN_ID itself is not changed (Toren never resets a run in place: a "
    "reset is a fork). --input replaces the input (JSON if it parses, else a string; "
    "@file reads it). Without --detach, follows the new run like 'toren run'.\n\n"
    "Exit codes as for 'toren run'."
    + examples(
        "toren runs fork RUN_ID --at main:5",
        "toren runs fork RUN_ID --at main:0 --input 'Where is order A-18?'",
        "toren runs fork RUN_ID --at main/3:2 --url http://127.0.0.1:8000 --detach",
    ),
)
@click.argument("run_id")
@click.option(
    "--at",
    required=True,
    help="STREAM:POSITION: the first step that runs live (e.g. main:5; steps of a child "
    "stream: main/3:2). 'toren runs events RUN_ID' shows the positions.",
)
@click.option("--input", "input_", default=None, help="The new run's input instead of RUN_ID's.")
@_DETACH
@_JSON
@_CODE_VERSION
@backend_options
def fork(
    run_id: str,
    at: str,
    input_: str | None,
    detach: bool,
    as_json: bool,
    code_version: str | None,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    value = UNSET if input_ is None else parse_payload(input_)

    async def action(backend: Backend) -> Run:
        run = await backend.fork(run_id, at=at, input=value)
        if not (detach or as_json):
            out().print(f"run {escape(run.id)}: forked from run {escape(run_id)} at {escape(at)}")
        return run

    raise SystemExit(
        _go(url, token, agents_root, database_url, code_version, detach, as_json, action)
    )
