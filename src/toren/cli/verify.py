"""``toren runs verify``: re-derive every digest of a run (or of every run) from the stored
events and blobs, by the rules of docs/digest.md, and say per step whether it matches."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from toren.cli._common import EXIT_OK, counted, database_url_for, examples, out, run_async
from toren.core.verify import RunVerification, verify_run
from toren.store import connect

EXIT_MISMATCH = 7  # toren runs verify: a recorded digest does not re-derive from the log

_SHOWN = {"verified": "[green]ok[/]", "unverifiable": "[yellow]cannot verify[/]"}


@click.command(
    "verify",
    help="Re-derive every request digest of a run from its stored events and blobs (the "
    "rules of docs/digest.md) and print, per step, whether it matches, cannot be verified "
    "(and why) or mismatches (and where). Exits 7 on any mismatch (with --strict, also "
    "when a step cannot be verified): a CI or audit gate. Reads the database directly; "
    "over HTTP use GET /v1/runs/{id}/verify."
    + examples(
        "toren runs verify RUN_ID",
        "toren runs verify --all --json",
        "toren runs verify --all --database-url postgresql://...",
    ),
)
@click.argument("run_id", required=False)
@click.option("--all", "every", is_flag=True, help="Verify every run of the database.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report per run.")
@click.option("--strict", is_flag=True, help="Also fail when a step cannot be verified.")
@click.option(
    "--agents",
    "agents_root",
    envvar="TOREN_AGENTS",
    default=".",
    show_default=True,
    type=click.Path(path_type=Path),
    help="The project whose embedded database (<agents>/.toren/toren.db) to read. "
    "[env: TOREN_AGENTS]",
)
@click.option(
    "--database-url",
    envvar="TOREN_DATABASE_URL",
    default=None,
    help="The database to read instead: sqlite:///path.db or postgresql://... "
    "[env: TOREN_DATABASE_URL]",
)
def verify(
    run_id: str | None,
    every: bool,
    as_json: bool,
    strict: bool,
    agents_root: Path,
    database_url: str | None,
) -> None:
    if every == (run_id is not None):
        raise click.UsageError("give a RUN_ID or --all (not both)")
    url = database_url_for(agents_root.resolve(), database_url, create=False)
    reports = run_async(lambda: _verify(url, run_id))
    for report in reports:
        if as_json:
            click.echo(json.dumps(report.to_dict(), ensure_ascii=False))
        else:
            _print(report)
    if not as_json:
        _summary(reports)
    failed = any(not r.ok or (strict and r.count("unverifiable")) for r in reports)
    raise SystemExit(EXIT_MISMATCH if failed else EXIT_OK)


async def _verify(url: str, run_id: str | None) -> list[RunVerification]:
    store = await connect(url)
    try:
        if run_id is not None:
            return [await verify_run(store, run_id)]
        ids: list[str] = []
        cursor = None
        while page := await store.list_runs(limit=200, before=cursor):
            ids += [r.id for r in page]
            cursor = page[-1].id
        return [await verify_run(store, i) for i in reversed(ids)]  # oldest first
    finally:
        await store.close()


def _print(report: RunVerification) -> None:
    console = out()
    console.print(
        f"[bold]run {escape(report.run_id)}[/]: {counted(len(report.checks), 'step')}, "
        f"{report.count('verified')} verified, {report.count('unverifiable')} cannot be "
        f"verified, {counted(report.count('mismatch'), 'mismatch', 'mismatches')}",
        highlight=False,
    )
    for c in report.checks:
        verdict = _SHOWN.get(c.verdict, "[red bold]MISMATCH[/]")
        where = f"seq {c.seq:<5} {c.stream}:{c.position} (generation {c.generation})"
        line = f"  {verdict}  {escape(where)}  {c.kind or '?'}  {(c.recorded_digest or '-')[:16]}"
        if c.verdict == "mismatch" and c.derived_digest:
            line += f" (derived {c.derived_digest[:16]})"
        if c.note:
            line += f"\n      {escape(c.note)}"
        console.print(line, highlight=False)


def _summary(reports: list[RunVerification]) -> None:
    total = {v: sum(r.count(v) for r in reports) for v in ("verified", "unverifiable", "mismatch")}
    steps = sum(len(r.checks) for r in reports)
    out().print(
        f"{counted(len(reports), 'run')}, {counted(steps, 'step')}: {total['verified']} "
        f"verified, {total['unverifiable']} cannot be verified, "
        f"{counted(total['mismatch'], 'mismatch', 'mismatches')}",
        highlight=False,
    )
