"""``toren runs verify``: re-derive every digest of a run (or of every run) from the stored
events and blobs, by the rules of docs/digest.md, and say per step whether it matches."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from toren.cli._common import EXIT_OK, counted, database_url_for, examples, out, run_async
from toren.core.drivers.verify import RunVerification, verify_run
from toren.store import connect

EXIT_MISMATCH = 7  # toren runs verify: a recorded digest does not re-derive from the log

_SHOWN = {"verified": "[green]ok[/]", "unverifiable": "[yellow]cannot verify[/]"}


@click.command(
    "verify",
    help="Re-derive every request digest of a run from its stored events and blobs (the "
    "rules of docs/digest.md) and print, per step, whether it matches, cannot be verified "
    "(and why) or mismatches (and where), and what else is covered: the response and its "
    "usage (token counts, cost) against the step's response digest, and the run's event "
    "chain (a deleted, moved or altered event). Exits 7 on any mismatch or chain break "
    "(with --strict, also "
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
        f"verified, {counted(report.count('mismatch'), 'mismatch', 'mismatches')}; responses: "
        f"{report.responses('verified')} verified, {report.responses('mismatch')} altered, "
        f"{report.responses('not covered')} not covered; chain: "
        f"{counted(len(report.chain.breaks), 'break')}",
        highlight=False,
    )
    for c in report.checks:
        bad = "mismatch" in (c.verdict, c.response)
        verdict = "[red bold]MISMATCH[/]" if bad else _SHOWN.get(c.verdict, "?")
        where = f"seq {c.seq:<5} {c.stream}:{c.position} (generation {c.generation})"
        line = f"  {verdict}  {escape(where)}  {c.kind or '?'}  {(c.recorded_digest or '-')[:16]}"
        if c.verdict == "mismatch" and c.derived_digest:
            line += f" (derived {c.derived_digest[:16]})"
        line += f"\n      covers: {escape(c.covered)}"
        for note in (c.note, c.response_note if c.response == "mismatch" else None):
            if note:
                line += f"\n      {escape(note)}"
        console.print(line, highlight=False)
    _print_chain(report)


def _print_chain(report: RunVerification) -> None:
    chain = report.chain
    console = out()
    if not chain.linked and not chain.breaks:
        console.print(
            "  chain: not covered (recorded by an earlier version): a deleted or moved "
            "event cannot be detected in this log",
            highlight=False,
        )
    else:
        earlier = (
            f", {_count(chain.not_covered, 'event')} not covered (recorded by an earlier version)"
            if chain.not_covered
            else ""
        )
        state = "[red bold]BROKEN[/]" if chain.breaks else "[green]ok[/]"
        console.print(
            f"  chain: {state}, {_count(chain.linked, 'event')} linked{earlier}; "
            f"head {(chain.head or '-')[:16]}",
            highlight=False,
        )
    for b in chain.breaks:
        console.print(
            f"  [red bold]CHAIN BREAK[/]  {escape(b.where)}\n      {escape(b.note)}",
            highlight=False,
        )


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _summary(reports: list[RunVerification]) -> None:
    total = {v: sum(r.count(v) for r in reports) for v in ("verified", "unverifiable", "mismatch")}
    steps = sum(len(r.checks) for r in reports)
    out().print(
        f"{counted(len(reports), 'run')}, {counted(steps, 'step')}: {total['verified']} "
        f"verified, {total['unverifiable']} cannot be verified, "
        f"{counted(total['mismatch'], 'mismatch', 'mismatches')}",
        highlight=False,
    )
    covered = sum(r.responses("verified") for r in reports)
    earlier = sum(r.responses("not covered") for r in reports)
    out().print(
        f"responses: {covered} verified, {earlier} not covered (recorded by an earlier "
        f"version), {sum(r.responses('mismatch') for r in reports)} altered; chain: "
        f"{counted(sum(len(r.chain.breaks) for r in reports), 'break')}",
        highlight=False,
    )
