"""``toren plan``: before deploying, replay every in-flight run against the current code
without executing anything live, and report what would be invalidated and what re-running
it would cost. With ``--fail-on-invalidation`` it gates a deploy in CI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from toren.cli._common import (
    EXIT_OK,
    NoDatabase,
    err,
    examples,
    open_existing_runtime,
    out,
    run_async,
)
from toren.cli.plan_pool import DEFAULT_MAX_JOBS, MAX_JOBS, MIN_SHARED_STEPS, PlanPool, default_jobs
from toren.cli.runs import backend_options
from toren.cli.view import money
from toren.core.contract.values import InvalidationCause
from toren.core.drivers.plan import PLAN_LIMIT, plan_report
from toren.runtime import close_runtime

# Without --limit the CLI plans every in-flight run: a pre-deploy check that skipped some
# would vouch for runs it never replayed.
UNLIMITED = 2**62

EXIT_WOULD_INVALIDATE = 6  # --fail-on-invalidation and something would be re-run
EMPTY = "sqlite:///:memory:"  # what a plan reads where no database exists yet


@click.command(
    "plan",
    help="Replay every in-flight run against the current code, executing nothing, and "
    "report which streams would be invalidated, from which step, with which digests, and "
    "the recorded cost of what would be re-run."
    + examples(
        "toren plan                          # against the embedded database",
        "toren plan --fail-on-invalidation   # exit 6 if a deploy would re-run anything",
        "toren plan --url https://toren.example.com --json",
        "TOREN_DATABASE_URL=postgresql://... toren plan --agents ./agents",
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--fail-on-invalidation",
    is_flag=True,
    help=f"Exit {EXIT_WOULD_INVALIDATE} when any stream would be invalidated (or a run "
    "cannot be planned, or runs in flight were left out of the plan).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Plan at most this many in-flight runs (default: every one; with --url, the "
    f"server plans at most {PLAN_LIMIT} per request). The report says when runs were "
    "left out.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=MAX_JOBS),
    default=None,
    help="Plan in this many processes (default: one per core, at most "
    f"{DEFAULT_MAX_JOBS}; a plan of fewer than {MIN_SHARED_STEPS} recorded steps uses one). "
    "Ignored with --url: the server plans.",
)
@click.option(
    "--code-version",
    envvar="TOREN_CODE_VERSION",
    default=None,
    help="The code version the plan replays as (default: the agent directory hash). "
    "[env: TOREN_CODE_VERSION]",
)
@backend_options
def plan(
    as_json: bool,
    fail_on_invalidation: bool,
    limit: int | None,
    jobs: int | None,
    code_version: str | None,
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
) -> None:
    # The worker processes start first, before any event loop or database thread runs
    # (see toren.cli.plan_pool).
    pool = PlanPool(
        1 if url else (jobs or default_jobs()), agents_root.resolve(), database_url, code_version
    )
    try:
        with pool:
            report = run_async(
                lambda: _report(url, token, agents_root, database_url, code_version, limit, pool)
            )
    except NoDatabase as exc:
        # Nothing has run: an empty plan, reported in its usual shape, and no new database.
        report = run_async(
            lambda: _report(None, None, agents_root, EMPTY, code_version, limit, None)
        )
        err().print(f"no runs yet: there is no database at {escape(str(exc.path))}")
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _print(report)
    if report.get("more"):
        # On stderr with --json too: a partial plan must never pass for a whole one.
        how = (
            f"the server plans at most {PLAN_LIMIT} per request: plan against the database "
            "(--database-url or TOREN_DATABASE_URL, without --url) to check every one"
            if url
            else "pass a larger --limit, or none to plan every one"
        )
        err().print(
            f"[yellow]more runs are in flight than the {report['runs']} planned[/]: the "
            f"others were not checked; {how}"
            + (" (exit 6: a gate cannot vouch for them)" if fail_on_invalidation else "")
        )
    if fail_on_invalidation and (report["invalidated"] or report["problems"] or report.get("more")):
        raise SystemExit(EXIT_WOULD_INVALIDATE)
    raise SystemExit(EXIT_OK)


async def _report(
    url: str | None,
    token: str | None,
    agents_root: Path,
    database_url: str | None,
    code_version: str | None,
    limit: int | None,
    pool: PlanPool | None,
) -> dict[str, object]:
    if url:
        from toren.client import AsyncTorenClient

        async with AsyncTorenClient(url, token) as client:
            return await client.plan(limit=min(limit or PLAN_LIMIT, PLAN_LIMIT))
    runtime = await open_existing_runtime(agents_root, database_url, code_version)
    try:
        return await plan_report(
            runtime.store,
            runtime.resolver,
            code_version=runtime.deps.code_version,
            limit=limit or UNLIMITED,
            shards=pool,
        )
    finally:
        await close_runtime(runtime)


def _print(report: dict[str, Any]) -> None:
    console = out()
    plans = report["plans"]
    if not plans:
        console.print("no runs in flight: nothing to plan")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in (
        "run",
        "agent",
        "status",
        "stream",
        "from step",
        "expected",
        "actual",
        "re-run cost",
    ):
        table.add_column(column, no_wrap=column in ("run", "expected", "actual"))
    for p in plans:
        agent = p["agent"] + (f"/{p['process']}" if p["process"] != "main" else "")
        if p["problem"]:
            table.add_row(
                p["run_id"], agent, p["status"], "", "", "", "", f"[red]{p['problem']}[/]"
            )
        for f in p["findings"]:
            table.add_row(
                p["run_id"],
                agent,
                p["status"],
                f["stream"],
                str(f["from_pos"]),
                (f["expected_digest"] or "-")[:12],
                (f["actual_digest"] or "(ended)")[:12],
                money(f["suffix_cost_usd"]),
            )
    clean = len(plans) - report["invalidated"] - report["problems"]
    if report["invalidated"] or report["problems"]:
        console.print(table)
        for p in plans:
            for f in p["findings"]:
                where = f"{p['run_id']} {f['stream']} #{f['from_pos']}"
                console.print(f"{escape(where)}: {escape(_changed(f))}", highlight=False)
    console.print(
        f"{len(plans)} runs in flight: {clean} replay cleanly, "
        f"{report['invalidated']} would be invalidated"
        + (f", {report['problems']} cannot be planned" if report["problems"] else "")
        + f"; re-running costs {money(report['rerun_cost_usd'])} (recorded cost, an estimate)"
    )


def _changed(finding: dict[str, Any]) -> str:
    """Which part of the request differs (from the finding's ``changes``)."""
    texts = [str(c.get("text")) for c in finding.get("changes") or []]
    if texts:
        return "; ".join(texts)
    if finding.get("cause") == InvalidationCause.STREAM_ENDED:
        return "the code ends the stream here"
    return "-"
