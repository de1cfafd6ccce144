"""External commands behind one small interface, so ``toren deploy-aws`` is testable.

:class:`SubprocessRunner` runs commands for real; :class:`RecordingRunner` records them
and answers from a script (optionally handing some, e.g. read-only ``git``, to a real
runner), which is what the tests use.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = [
    "Command",
    "CommandResult",
    "CommandRunner",
    "RecordingRunner",
    "SubprocessRunner",
    "describe",
]


@dataclass(frozen=True)
class Command:
    """One external command. ``stdin`` is fed to it and never printed (a password)."""

    argv: tuple[str, ...]
    cwd: Path | None = None
    stdin: str | None = None
    capture: bool = False


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandRunner(Protocol):
    def run(self, command: Command) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands; streams their output to the terminal unless ``capture`` is set."""

    def run(self, command: Command) -> CommandResult:
        try:
            completed = subprocess.run(  # an argv list, never a shell
                list(command.argv),
                cwd=command.cwd,
                input=command.stdin,
                capture_output=command.capture,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{command.argv[0]}: command not found")
        return CommandResult(completed.returncode, completed.stdout or "", completed.stderr or "")


@dataclass
class RecordingRunner:
    """Records every command; answers from ``responses`` keyed by argv prefix.

    Commands for which ``passthrough`` returns true go to ``delegate`` (still recorded).
    Anything unscripted succeeds with empty output.
    """

    responses: dict[tuple[str, ...], CommandResult] = field(default_factory=dict)
    delegate: CommandRunner | None = None
    passthrough: Callable[[Command], bool] = lambda command: False
    commands: list[Command] = field(default_factory=list)

    def run(self, command: Command) -> CommandResult:
        self.commands.append(command)
        if self.delegate is not None and self.passthrough(command):
            return self.delegate.run(command)
        for prefix in sorted(self.responses, key=len, reverse=True):
            if command.argv[: len(prefix)] == prefix:
                return self.responses[prefix]
        return CommandResult(0)

    @property
    def argvs(self) -> list[tuple[str, ...]]:
        return [c.argv for c in self.commands]


def describe(argv: Sequence[str]) -> str:
    """A command as a person would type it."""
    return shlex.join(argv)
