"""The ``toren`` command. Every subcommand lives in its own module; this one holds the
group, the global flags and the error boundary: a Toren error is one line plus a hint
(``--debug`` shows the traceback), never a traceback by default."""

from __future__ import annotations

import sys
from typing import Any

import click

from toren import __version__
from toren.cli._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    Refused,
    State,
    err,
    examples,
    is_reportable,
    report,
    setup_logging,
)
from toren.cli.fixforward import fork, retry
from toren.cli.plan import plan
from toren.cli.project import init
from toren.cli.retention import export_command, import_command, prune_command
from toren.cli.runs import run, runs
from toren.cli.schedules import schedules
from toren.cli.servers import dev, serve, worker
from toren.cli.verify import verify
from toren.deprecations import install_one_line_warnings


class TorenGroup(click.Group):
    """Catches Toren errors at the top. ``deploy-aws`` is imported only when used."""

    lazy = {"deploy-aws": ("toren.cli.deploy_aws", "deploy_aws")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, attr = self.lazy[name]
            try:
                command: click.Command = getattr(__import__(module, fromlist=[attr]), attr)
            except ImportError as exc:
                raise Refused(
                    f"'toren {name}' is unavailable: {exc}; install toren-run[aws]"
                ) from None
            return command
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            err().print("interrupted")
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            debug = ctx.find_object(State)
            if (debug is not None and debug.debug) or not is_reportable(exc):
                raise
            report(exc)
            ctx.exit(EXIT_ERROR)


@click.group(
    "toren",
    cls=TorenGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="Toren: a durable runtime for LLM agents."
    + examples(
        "toren init hello && cd hello      # scaffold an agent project",
        'toren run . "Hi there"             # run it once, offline, and follow it live',
        "toren dev                          # worker + API + console, reload on change",
        "toren runs list                    # what ran, and how it ended",
    ),
)
@click.option("--debug", is_flag=True, envvar="TOREN_DEBUG", help="Show tracebacks for errors.")
@click.option(
    "--color/--no-color",
    default=None,
    help="Force colour on or off (default: colour on a terminal, unless NO_COLOR is set).",
)
@click.version_option(
    __version__, "-V", "--version", prog_name="toren", message="%(prog)s %(version)s"
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, color: bool | None) -> None:
    ctx.obj = State(debug=debug, color=color)
    setup_logging("error")
    install_one_line_warnings()
    if color is not None:
        ctx.color = color


@cli.command(
    help="Print Toren's version."
    + examples("toren version", "toren version --deprecations   # what will stop working, and when")
)
@click.option(
    "--deprecations",
    is_flag=True,
    help="Also list deprecated agent.yaml keys, CLI flags and HTTP fields still accepted.",
)
def version(deprecations: bool) -> None:
    click.echo(f"toren {__version__}")
    if deprecations:
        _print_deprecations()


def _print_deprecations() -> None:
    from toren.deprecations import registry

    entries = registry()
    if not entries:
        click.echo("no deprecations")
        return
    click.echo("deprecated (still accepted):")
    for d in entries:
        click.echo(f"  {d.surface:<11} {d.old!r} -> {d.new!r}  (removed in {d.removed_in})")


cli.add_command(init)
cli.add_command(dev)
cli.add_command(run)
cli.add_command(runs)
runs.add_command(verify)
runs.add_command(retry)
runs.add_command(fork)
runs.add_command(prune_command)
runs.add_command(export_command)
runs.add_command(import_command)
cli.add_command(worker)
cli.add_command(serve)
cli.add_command(plan)
cli.add_command(schedules)


def main(argv: list[str] | None = None) -> None:
    """The console script."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="toren")


if __name__ == "__main__":  # pragma: no cover
    main()
