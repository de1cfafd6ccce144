"""``toren runs prune | export | import``: the retention commands. They work on the
database itself (``--database-url``, or the embedded one under ``--agents``), not through
a server: pruning is an operator's job, like a backup."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import click

from toren.cli._common import counted, database_url_for, examples, out, run_async
from toren.core.contract.values import TERMINAL_STATUSES, RunStatus
from toren.durations import parse_duration
from toren.store import Backend, connect
from toren.store.retention import (
    PruneResult,
    count_finished,
    export_runs,
    finished_ids,
    import_runs,
    prune,
    sweep_blobs,
)

# The values, not the members: click.Choice takes an Enum member by its *name*.
FINISHED = sorted(s.value for s in map(RunStatus, TERMINAL_STATUSES))


def database_options(fn: Any) -> Any:
    fn = click.option(
        "--database-url",
        envvar="TOREN_DATABASE_URL",
        default=None,
        help="sqlite:///path.db or postgresql://... (default: the embedded database under "
        "--agents). [env: TOREN_DATABASE_URL]",
    )(fn)
    return click.option(
        "--agents",
        "agents_root",
        envvar="TOREN_AGENTS",
        default=".",
        show_default=True,
        type=click.Path(path_type=Path),
        help="Agent directory; the embedded database is <agents>/.toren/toren.db. "
        "[env: TOREN_AGENTS]",
    )(fn)


def status_option(fn: Any) -> Any:
    return click.option(
        "--status",
        "statuses",
        multiple=True,
        type=click.Choice(FINISHED),
        help="Only runs that finished with this status (repeatable; default: all three). "
        "Runs in flight or waiting are never touched.",
    )(fn)


def _cutoff(duration: str) -> float:
    try:
        return time.time() - parse_duration(duration)
    except Exception as exc:
        raise click.BadParameter(str(exc), param_hint="'--finished-before'") from None


@contextlib.asynccontextmanager
async def _store(agents_root: Path, database_url: str | None) -> AsyncIterator[Backend]:
    store = await connect(database_url_for(agents_root.resolve(), database_url, create=False))
    try:
        yield store
    finally:
        await store.close()


@contextlib.contextmanager
def _output(path: str, *, append: bool = False) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
        return
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        yield handle


@click.command(
    "prune",
    help="Delete runs that finished before a given age, with their events, inbox and the "
    "message bodies no other run stored. Runs in flight or waiting are never touched; "
    "workers may keep running meanwhile. Export first (--export, or `toren runs export`) "
    "to keep a copy."
    + examples(
        "toren runs prune --finished-before 30d --dry-run",
        "toren runs prune --finished-before 30d --export runs-archive.jsonl",
        "toren runs prune --finished-before 7d --status failed --status cancelled",
    ),
)
@click.option(
    "--finished-before",
    "age",
    required=True,
    help="Age: runs that finished at least this long ago (30d, 12h, 1d12h, 90m, 45s, 2w).",
)
@status_option
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--export",
    "export_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Append each batch of runs to this JSON Lines file before deleting it.",
)
@click.option(
    "--batch",
    default=200,
    show_default=True,
    type=click.IntRange(1, 5000),
    help="Runs deleted per transaction.",
)
@click.option(
    "--pause",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds to wait between batches (to leave the database to live work).",
)
@click.option(
    "--no-sweep",
    is_flag=True,
    help="Skip the final sweep of shared message bodies no remaining run references "
    "(it reads the whole log; run it later with another prune).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
@database_options
def prune_command(
    age: str,
    statuses: tuple[str, ...],
    dry_run: bool,
    export_path: str | None,
    batch: int,
    pause: float,
    no_sweep: bool,
    as_json: bool,
    agents_root: Path,
    database_url: str | None,
) -> None:
    before = _cutoff(age)
    chosen = statuses or tuple(FINISHED)

    async def go() -> dict[str, int | bool]:
        async with _store(agents_root, database_url) as store:
            if dry_run:
                runs, events = await count_finished(store, before=before, statuses=chosen)
                return {"dry_run": True, "runs": runs, "events": events}
            with contextlib.ExitStack() as stack:
                handle = (
                    stack.enter_context(open(export_path, "a", encoding="utf-8"))
                    if export_path
                    else None
                )

                async def save(ids: list[str]) -> None:
                    assert handle is not None
                    await export_runs(store, ids, handle)

                def progress(done: PruneResult) -> None:
                    if not as_json:
                        click.echo(
                            f"pruned {counted(done.runs, 'run')} ({counted(done.events, 'event')})",
                            err=True,
                        )

                total = await prune(
                    store,
                    before=before,
                    statuses=chosen,
                    batch=batch,
                    pause=pause,
                    before_delete=save if handle is not None else None,
                    on_batch=progress,
                )
            if not no_sweep:
                total.blobs += await sweep_blobs(store)
            return {"dry_run": False, **total.to_dict()}

    result = run_async(go)
    if as_json:
        click.echo(json.dumps(result))
    elif result["dry_run"]:
        out().print(
            f"would prune {counted(result['runs'], 'run')} "
            f"({counted(result['events'], 'event')}) that finished "
            f"before {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(before))}"
        )
    else:
        out().print(
            f"pruned {counted(result['runs'], 'run')}: {counted(result['events'], 'event')}, "
            f"{counted(result['inbox'], 'inbox message')}, "
            f"{counted(result['blobs'], 'message body', 'message bodies')}"
        )


@click.command(
    "export",
    help="Write runs, their events, inbox messages and message bodies as JSON Lines, "
    "importable again with `toren runs import`."
    + examples(
        "toren runs export run_0193... > one-run.jsonl",
        "toren runs export --finished-before 30d -o archive.jsonl",
    ),
)
@click.argument("run_ids", nargs=-1)
@click.option(
    "--finished-before",
    "age",
    default=None,
    help="Every run that finished at least this long ago (30d, 12h, ...).",
)
@status_option
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    help="File to write (- for standard output).",
)
@database_options
def export_command(
    run_ids: tuple[str, ...],
    age: str | None,
    statuses: tuple[str, ...],
    output: str,
    agents_root: Path,
    database_url: str | None,
) -> None:
    if bool(run_ids) == (age is not None):
        raise click.UsageError("give either run ids or --finished-before, not both or neither")
    before = _cutoff(age) if age is not None else None

    async def go() -> int:
        async with _store(agents_root, database_url) as store:
            with _output(output) as handle:
                if before is None:
                    return await export_runs(store, run_ids, handle)
                ids = finished_ids(store, before=before, statuses=statuses or FINISHED)
                return await export_runs(store, ids, handle)

    count = run_async(go)
    click.echo(f"exported {counted(count, 'run')}", err=True)


@click.command(
    "import",
    help="Read runs written by `toren runs export` back into the database. Runs already "
    "present are skipped, so an import can be repeated."
    + examples("toren runs import archive.jsonl", "cat archive.jsonl | toren runs import -"),
)
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
@database_options
def import_command(path: str, as_json: bool, agents_root: Path, database_url: str | None) -> None:
    async def go() -> dict[str, Any]:
        url = database_url_for(agents_root.resolve(), database_url, create=True)
        store = await connect(url)
        try:
            if path == "-":
                return (await import_runs(store, sys.stdin)).to_dict()
            with open(path, encoding="utf-8") as handle:
                return (await import_runs(store, handle)).to_dict()
        finally:
            await store.close()

    result = run_async(go)
    if as_json:
        click.echo(json.dumps(result))
    else:
        out().print(
            f"imported {counted(result['runs'], 'run')} ({counted(result['events'], 'event')}, "
            f"{counted(result['blobs'], 'message body', 'message bodies')}); "
            f"{result['skipped']} already present"
        )
