"""Deprecation warnings for Toren's settled surfaces (agent.yaml keys, CLI flags, HTTP fields).

The versioning contract: a renamed or removed key is still accepted for one more minor,
with a warning that names its replacement and the release that stops accepting it.

:class:`TorenDeprecationWarning` derives from :class:`FutureWarning`, not
:class:`DeprecationWarning`, on purpose: Python hides ``DeprecationWarning`` outside
``__main__`` by default, and these warnings are addressed to the person who wrote the
agent.yaml or the command line, not to a library developer. They must be seen.
"""

from __future__ import annotations

import warnings


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
