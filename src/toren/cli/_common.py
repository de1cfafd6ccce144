"""What every command shares: consoles, errors as one line plus a hint, exit codes,
option helpers and reading a run input."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console

from toren.config import Settings
from toren.core.contract import inputs
from toren.core.contract.values import RunStatus
from toren.errors import (
    AgentConfigError,
    AgentNotFound,
    CorruptRow,
    IdempotencyConflict,
    InvalidInput,
    MissingProviderKey,
    ProviderUnavailable,
    RunNotFound,
    StorageError,
    TorenError,
    UserError,
)
from toren.redact import Redactor, secrets_from_env
from toren.runtime import Runtime, open_runtime, sqlite_url_for
from toren.store.sqlite import parse_sqlite_url
from toren.store.urls import shown_url

T = TypeVar("T")

# Exit codes (documented in docs/cli.md; scripts rely on them).
EXIT_OK = 0
EXIT_FAILED = 1  # the run failed
EXIT_USAGE = 2  # click's usage errors: a bad flag or argument
EXIT_CANCELLED = 3  # the run was cancelled
EXIT_WAITING = 4  # the run waits for a message; it stays waiting
EXIT_ERROR = 5  # Toren could not do what was asked (bad agent, unknown run, no server...)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM: the run goes on elsewhere or on resume

STATUS_EXIT: dict[str, int] = {
    RunStatus.COMPLETED: EXIT_OK,
    RunStatus.FAILED: EXIT_FAILED,
    RunStatus.CANCELLED: EXIT_CANCELLED,
}


PIPE_WIDTH = 10_000  # columns of output that is not a terminal: lines are never cut


class State:
    """Global flags, stored on the click context."""

    def __init__(self, debug: bool = False, color: bool | None = None) -> None:
        self.debug = debug
        self.color = color
        self.command: click.Context | None = None  # the subcommand running (for hints)

    def console(self, *, stderr: bool = False) -> Console:
        no_color = self.color is False or "NO_COLOR" in os.environ
        console = Console(
            stderr=stderr,
            no_color=no_color,
            force_terminal=True if self.color else None,
            highlight=False,
        )
        # A person's terminal gets word-wrapped lines; a pipe or a log gets whole lines,
        # and whole tables: rich would squeeze them into 80 columns ("ag… st… $0.…").
        # COLUMNS, when set, still decides.
        console.soft_wrap = not console.is_terminal
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            console.width = PIPE_WIDTH
        return console


def state() -> State:
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(State) if ctx is not None else None
    return found or State()


def out() -> Console:
    return state().console()


def err() -> Console:
    return state().console(stderr=True)


_SERVER_DOWN = "is the server running ('toren serve' or 'toren dev')? check --url / TOREN_API_URL"
_RUN_FINISHED = "the run has ended and takes no more messages; start a new one with 'toren run'"


def hint_for(exc: BaseException) -> str:
    """What to do next, for the error just reported: errors from a server (--url) by the
    server's code, the others by their class."""
    command, reach = _failed_command()
    if isinstance(exc, NoDatabase):
        return (
            "start a run first ('toren run DIR'), or point --agents / --database-url "
            "at the directory or database that holds the runs"
        )
    if _is_api_error(exc):
        return _server_hint(str(getattr(exc, "code", "")), command, reach)
    if getattr(exc, "code", "") == "run_finished":
        return _RUN_FINISHED
    if isinstance(exc, MissingProviderKey):
        return (
            "set the variable named above where the run executes (this shell for 'toren "
            "run', the worker's environment otherwise); nothing was started"
        )
    if getattr(exc, "code", "") == "insecure_bind":
        return (
            "set a token (--token or TOREN_API_TOKEN, at least 16 characters) to serve "
            "beyond loopback, or keep --host 127.0.0.1"
        )
    if getattr(exc, "code", "") == "weak_token":
        return "set --token / TOREN_API_TOKEN to a long random string (the command above)"
    if getattr(exc, "code", "") == "bad_allowed_host":
        return "pass --allowed-host once per name (or TOREN_ALLOWED_HOSTS, comma-separated)"
    if isinstance(exc, AgentConfigError):
        return "fix the file named above, then run the command again"
    if isinstance(exc, AgentNotFound):
        if exc.details.get("process"):
            return "pass --process with one of the processes named above"
        return "pass a path to an agent directory, or set --agents to the directory holding it"
    if isinstance(exc, RunNotFound):
        return f"list the runs there with 'toren runs list{reach}'"
    if isinstance(exc, IdempotencyConflict):
        return "use a new idempotency key, or the same arguments as the first request"
    if isinstance(exc, InvalidInput):
        return f"see '{command} --help' for the expected shape"
    if isinstance(exc, ProviderUnavailable):
        return (
            "set up the provider named above: its API key in the environment (e.g. "
            "OPENAI_API_KEY), its package installed, or its entry under 'providers:'"
        )
    if isinstance(exc, CorruptRow):
        return "repair the row named above (or restore the database); Toren never skips it"
    if isinstance(exc, StorageError) and exc.details.get("install"):
        # A package missing here, not a database problem: the URL is fine.
        return (
            f"install it where toren runs: {exc.details['install']} (from a Toren checkout: "
            "pip install '/path/to/toren[postgres]'), then run the command again"
        )
    if isinstance(exc, StorageError):
        return "check --database-url / TOREN_DATABASE_URL and that the database is reachable"
    if isinstance(exc, OSError) and exc.filename:
        return f"check {str(exc.filename)!r}: that it exists and that you may read (or write) it"
    if _is_connect_error(exc):
        return _SERVER_DOWN
    if _is_http_error(exc):
        return "check --url / TOREN_API_URL and --token / TOREN_API_TOKEN"
    return "run again with --debug for the traceback"


def _server_hint(code: str, command: str, reach: str) -> str:
    if code == "connection_error":
        return _SERVER_DOWN
    if code == "invalid_token":
        return "fix --token / TOREN_API_TOKEN: one line of visible ASCII (no trailing newline)"
    if code == "unexpected_response":
        return "point --url / TOREN_API_URL at the Toren server itself (not a proxy's page)"
    if code == "stream_timeout":
        return "the server (or a proxy) stopped answering; check it, then run the command again"
    if code in ("unauthorized", "forbidden"):
        return "pass the server's token with --token or TOREN_API_TOKEN"
    if code == "run_not_found":
        return f"list the server's runs with 'toren runs list{reach}'"
    if code == "agent_not_found":
        return "the server runs the agents under its own --agents directory; check the name"
    if code == "run_finished":
        return _RUN_FINISHED
    if code == "idempotency_conflict":
        return "use a new idempotency key, or the same arguments as the first request"
    if code in ("invalid_request", "invalid_input"):
        return f"see '{command} --help' for the expected shape"
    if code == "agent_config_invalid":
        return "fix the server's agent directory (the file named above), then try again"
    if code == "internal_error":
        return "the server failed: its log has the cause"
    return "check --url / TOREN_API_URL and --token / TOREN_API_TOKEN"


def remember_command() -> None:
    """Note the running command's context: the error boundary (in the group, after the
    command's context has closed) names it and its options in the hint."""
    state().command = click.get_current_context()


def _failed_command() -> tuple[str, str]:
    ctx = state().command
    if ctx is None:
        return "toren <command>", ""
    root = ctx.params.get("agents_root")
    return ctx.command_path, follow_up_options(Path(root) if root else None, ctx=ctx)


def _is_api_error(exc: BaseException) -> bool:
    from toren.client import TorenAPIError

    return isinstance(exc, TorenAPIError)


def _is_connect_error(exc: BaseException) -> bool:
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a dependency
        return False
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))


def _is_http_error(exc: BaseException) -> bool:
    try:
        import httpx
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, httpx.HTTPError)


def is_reportable(exc: BaseException) -> bool:
    """Errors shown as one line plus a hint (anything else is a bug: traceback)."""
    return isinstance(exc, (TorenError, OSError)) or _is_http_error(exc)


def report(exc: BaseException) -> None:
    console = err()
    message = exc.message if isinstance(exc, TorenError) else str(exc) or type(exc).__name__
    if _is_connect_error(exc):
        message = f"cannot connect to the Toren server: {exc}"
    # Messages quote user input and drivers' text: brackets in them are not markup.
    console.print(f"[bold red]error:[/] {_escape(message)}", markup=True, highlight=False)
    console.print(f"[dim]hint:[/] {_escape(hint_for(exc))}", markup=True, highlight=False)


class Refused(click.ClickException):
    """A command that could not do what was asked, with click's one-line "Error: ..."
    and the CLI's exit code for that (5), not click's default 1, which the CLI keeps for
    "the run failed"."""

    exit_code = EXIT_ERROR


def fail(message: str, hint: str, code: int = EXIT_ERROR) -> NoReturn:
    console = err()
    console.print(f"[bold red]error:[/] {_escape(message)}")
    console.print(f"[dim]hint:[/] {_escape(hint)}")
    raise SystemExit(code)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _Formatter(logging.Formatter):
    """One line per record; tracebacks only with --debug; no secrets, ever: a provider
    SDK's error (or an agent's exception) can quote a key, and log lines end up in files
    and log services that API responses never reach."""

    def __init__(self, debug: bool, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.debug = debug
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        if not self.debug and record.exc_info:
            exc = record.exc_info[1]
            record = logging.makeLogRecord(record.__dict__)
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = record.exc_text = None
        return self.redactor.text(super().format(record))


def setup_logging(level: str = "error", secrets: Sequence[str] = ()) -> None:
    """Toren's log lines on stderr: ``level`` and up (everything with --debug). Every line
    is redacted of ``secrets`` (a server's API tokens, each on its own: call this after
    parsing them) and of the credential-like environment variables."""
    debug = state().debug
    logger = logging.getLogger("toren")
    handler = _Stderr()
    redactor = Redactor([*secrets, *secrets_from_env(os.environ)])
    handler.setFormatter(_Formatter(debug, redactor))
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG if debug else getattr(logging, level.upper(), logging.INFO))
    # The HTTP server's lines (the access log at info) go the same way, through the same
    # redaction; servers.py hands uvicorn the level and no logging config of its own.
    server = logging.getLogger("uvicorn")
    server.handlers = [handler]
    server.propagate = False


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the word for that many: "1 run", "2 runs", "1 mismatch", "0 mismatches"."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def run_async(factory: Callable[[], Coroutine[object, object, T]]) -> T:
    return asyncio.run(factory())


# -- configuration --------------------------------------------------------------------


def settings_from(
    *,
    database_url: str | None = None,
    code_version: str | None = None,
    concurrency: int | None = None,
    drain_window: float | None = None,
) -> Settings:
    settings = Settings.from_env()
    changes: dict[str, object] = {}
    if database_url:
        changes["database_url"] = database_url
    if code_version:
        changes["code_version"] = code_version
    if concurrency is not None:
        changes["concurrency"] = concurrency
    if drain_window is not None:
        changes["drain_window"] = drain_window
    return settings.with_(**changes) if changes else settings


class RunFinished(UserError):
    """A message for a run that has ended (the HTTP API's 409 ``run_finished``)."""

    code = "run_finished"


class NoDatabase(RunNotFound):
    """A command that reads or steers runs found no database where it looked."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"there is no database at {path} yet: nothing has run with this agents "
            "directory (or --database-url); not creating one",
            path=str(path),
        )
        self.path = path


def database_url_for(root: Path, database_url: str | None, *, create: bool = True) -> str:
    """``--database-url`` when given, else the embedded database under the agents root.
    Without ``create`` (commands that only read or steer existing runs), a SQLite file
    that does not exist is :class:`NoDatabase` rather than a new, empty database."""
    project = root if root.is_dir() else root.parent
    url = database_url or sqlite_url_for(project, create=create)
    if not create and url.startswith("sqlite:"):
        path = parse_sqlite_url(url)[0]
        if path != ":memory:" and not Path(path).exists():
            raise NoDatabase(Path(path).resolve())
    return url


async def open_existing_runtime(
    agents_root: Path, database_url: str | None, code_version: str | None
) -> Runtime:
    """The runtime of a command that reads or steers existing runs: the agents under
    ``agents_root`` over a database that must already exist (see :func:`database_url_for`)."""
    root = agents_root.resolve()
    settings = settings_from(database_url=database_url, code_version=code_version)
    return await open_runtime(root, database_url_for(root, database_url, create=False), settings)


def follow_up_options(agents_root: Path | None = None, *, ctx: click.Context | None = None) -> str:
    """The options a printed follow-up command ("toren runs resume ID ...") needs to reach
    the runs this command reached, so that it works as copied: ``--agents`` when the agents
    root is not what the copy would default to (``TOREN_AGENTS``, else the current
    directory), ``--url`` / ``--database-url`` when given as flags (from the environment
    they reach the copy too). A password in a URL is shown as ``***``; a token never is."""
    ctx = ctx or click.get_current_context(silent=True)
    url = _flag_value(ctx, "url")
    parts: list[str] = []
    if url:
        parts += ["--url", shown_url(url)]
    else:
        default = Path(os.environ.get("TOREN_AGENTS") or ".").resolve()
        if agents_root is not None and agents_root.resolve() != default:
            parts += ["--agents", _shown_path(agents_root.resolve())]
        database_url = _flag_value(ctx, "database_url")
        if database_url:
            parts += ["--database-url", shown_url(database_url)]
    return "".join(" " + shlex.quote(part) for part in parts)


def _flag_value(ctx: click.Context | None, name: str) -> str | None:
    if ctx is None or ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
        return None
    value = ctx.params.get(name)
    return str(value) if value else None


def _shown_path(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix() or "."
    except ValueError:
        return str(path)


def read_input(value: str | None, message: str | None) -> object:
    """``--input JSON`` or ``--input @file.json``; a positional MESSAGE is a plain string.
    The value is held to the host API's nesting limit (``toren.core.contract.inputs``) here, so both
    backends refuse it alike, before anything is stored."""
    if value is not None and message is not None:
        raise click.UsageError("give either MESSAGE or --input, not both")
    if message is not None:
        return message
    if value is None:
        return None
    text, where = _read_arg(value, "--input")
    try:
        return inputs.loads(text, "run input", "input")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message, param_hint="'--input'") from None
    except ValueError as exc:
        raise click.BadParameter(
            f"{where} is not valid JSON ({exc}); quote a string as '\"text\"' or pass it as MESSAGE"
        ) from None


def parse_payload(value: str | None) -> object:
    """A message payload: JSON if it parses, else the text itself (``@file``: JSON read
    from the file). JSON nested past the limit is refused, not taken as text."""
    if value is None:
        return None
    text, where = _read_arg(value, "PAYLOAD")
    try:
        return inputs.loads(text, "message payload", "payload")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message, param_hint="'PAYLOAD'") from None
    except ValueError as exc:
        if not value.startswith("@"):
            return value
        raise click.BadParameter(f"{where} is not valid JSON ({exc})") from None


def _read_arg(value: str, name: str) -> tuple[str, str]:
    """The text of an argument that may be ``@file`` (``@-``: stdin), and what to call it."""
    if not value.startswith("@"):
        return value, name
    path = Path(value[1:])
    try:
        text = sys.stdin.read() if value == "@-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {str(path)!r}: {exc.strerror}") from None
    return text, str(path)


def examples(*lines: str) -> str:
    """The 'Examples' block of a command's help (\b keeps click from rewrapping it)."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"\n\n\b\nExamples:\n{body}"


def deprecated_flag(flag: str) -> None:
    """Say (on stderr) that a deprecated flag was used; it still works for one more minor."""
    from toren.deprecations import CLI_FLAGS, message

    key = next(k for k in CLI_FLAGS if k.endswith(" " + flag))
    err().print(f"warning: {message(key, CLI_FLAGS)}")
