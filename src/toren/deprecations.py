"""Deprecation warnings for Toren's settled surfaces (agent.yaml keys, CLI flags, HTTP fields).

The versioning contract: a renamed or removed key is still accepted for one more minor,
with a warning that names its replacement and the release that stops accepting it.

:class:`TorenDeprecationWarning` derives from :class:`FutureWarning`, not
:class:`DeprecationWarning`, on purpose: Python hides ``DeprecationWarning`` outside
``__main__`` by default, and these warnings are addressed to the person who wrote the
agent.yaml or the command line, not to a library developer. They must be seen.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, TextIO


class TorenDeprecationWarning(FutureWarning):
    """An old spelling that still works, for one more minor release."""


def warn_deprecated(
    old: str, new: str, removed_in: str, *, where: str, stacklevel: int = 3
) -> None:
    """Warn that ``old`` (found at ``where``) is deprecated in favour of ``new``."""
    warnings.warn(
        f"{where}: {old!r} is deprecated, use {new!r} instead; "
        f"{old!r} will stop being accepted in toren-run {removed_in}",
        TorenDeprecationWarning,
        stacklevel=stacklevel,
    )


@dataclass(frozen=True)
class Deprecation:
    """One old spelling still accepted. ``surface`` is ``agent.yaml``, ``cli`` or ``http``."""

    surface: str
    old: str
    new: str
    since: str
    removed_in: str


# Every deprecation of every settled surface, printed by ``toren version --deprecations``,
# declared here and used where parsed (``toren.agents.config`` re-exports DEPRECATED_KEYS).

# agent.yaml: old key -> (new key, first release that rejects the old key). Applies to the
# top level of agent.yaml and to every entry of ``processes:``. An entry stays here for
# exactly one minor after the rename, then moves to the "removed" list in CHANGELOG.md.
DEPRECATED_KEYS: dict[str, tuple[str, str]] = {
    "system_prompt": ("instructions", "0.3.0"),
}
CLI_FLAGS: dict[str, tuple[str, str]] = {
    # old flag: (new flag, removed in)
    "toren worker --drain-timeout": ("toren worker --drain-window", "0.3.0"),
}
HTTP_FIELDS: dict[str, tuple[str, str]] = {
    # old field: (new field, removed in)
    "POST /v1/runs idempotencyKey": ("POST /v1/runs idempotency_key", "0.3.0"),
}


def registry() -> list[Deprecation]:
    entries = [
        Deprecation("agent.yaml", old, new, "0.1.0", removed)
        for old, (new, removed) in sorted(DEPRECATED_KEYS.items())
    ]
    entries += [
        Deprecation("cli", old, new, "0.1.0", removed) for old, (new, removed) in CLI_FLAGS.items()
    ]
    entries += [
        Deprecation("http", old, new, "0.1.0", removed)
        for old, (new, removed) in HTTP_FIELDS.items()
    ]
    return entries


def message(surface_key: str, table: dict[str, tuple[str, str]]) -> str:
    new, removed_in = table[surface_key]
    return (
        f"{surface_key!r} is deprecated, use {new!r} instead; it will stop being accepted "
        f"in toren-run {removed_in}"
    )


def install_one_line_warnings() -> None:
    """Show Toren's deprecation warnings as one line, ``warning: <file>: <old> is
    deprecated, use <new> ...``, instead of Python's default form, which names the line
    of Toren's own source that raised it and quotes that line: noise to the person who
    wrote the agent.yaml. Other warnings keep Python's form. The CLI installs this."""
    if getattr(warnings.showwarning, "_toren_one_line", False):
        return
    original = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if isinstance(category, type) and issubclass(category, TorenDeprecationWarning):
            stream: Any = file if file is not None else sys.stderr
            try:
                stream.write(f"warning: {message}\n")
            except (AttributeError, OSError):
                pass  # no stderr (a daemon): nowhere to say it
            return
        original(message, category, filename, lineno, file, line)

    show._toren_one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = show
