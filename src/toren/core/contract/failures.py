"""What a failure records: the error of a failed tool, child or run, with a trimmed and
redacted traceback when the failure was raised by code (a tool, agent code), and which
recorded step failures ended a run (what a retry runs again).

A traceback is stored in the event log and on the run row, so it is trimmed (Toren's own
frames and the standard library's are left out: the agent author's frames are the ones
to read; at most :data:`MAX_FRAMES` frames and :data:`MAX_CHARS` characters) and redacted
(credential-shaped strings and the values of credential-named environment variables
become ``[redacted]``) before it is written.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path

from toren.core.contract.text import repair_text
from toren.errors import StepFailed, TorenError
from toren.redact import Redactor, secrets_from_env

MAX_FRAMES = 20
MAX_CHARS = 6000
_CHAIN = 3  # causes followed (``raise ... from exc``)

_TOREN_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_STDLIB_DIRS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
# The attribute a recorded step failure carries: the seq of the event that recorded it.
_SEQ = "_toren_failed_seq"


def _kept(filename: str) -> bool:
    path = os.path.realpath(filename) if not filename.startswith("<") else filename
    if path.startswith(_TOREN_DIR):
        return False
    if "site-packages" in path or "dist-packages" in path:
        return True  # a library the agent uses, even one installed beside the stdlib
    return not path.startswith(_STDLIB_DIRS)


def trimmed_traceback(exc: BaseException, redactor: Redactor | None = None) -> str:
    """The traceback of ``exc`` (and of up to three of its causes), its agent frames only,
    trimmed and redacted. Empty when no frame of it is worth showing."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN:
        seen.add(id(current))
        frames = [f for f in traceback.extract_tb(current.__traceback__) if _kept(f.filename)]
        dropped = max(0, len(frames) - MAX_FRAMES)
        text = "".join(traceback.format_exception_only(type(current), current))
        if frames:
            head = "Traceback (most recent call last, Toren's and Python's own frames left out):\n"
            if dropped:
                head += f"  ... {dropped} earlier frames left out ...\n"
            text = head + "".join(traceback.format_list(frames[-MAX_FRAMES:])) + text
        parts.append(text)
        current = current.__cause__
    if not any("Traceback" in p for p in parts):
        return ""
    text = "\nThe above was caused by:\n\n".join(reversed(parts)) if len(parts) > 1 else parts[0]
    if len(text) > MAX_CHARS:
        text = "... (trimmed)\n" + text[-MAX_CHARS:]
    redactor = redactor or Redactor(secrets_from_env(os.environ))
    return redactor.text(text)


def failure_dict(exc: BaseException) -> dict[str, object]:
    """The recorded error of ``exc``: ``{type, code, message}``, plus ``traceback`` when it
    was raised by code (not a Toren error: those say what happened in their message), or
    the traceback a recorded step failure carries (the tool's, the child's). The message
    and traceback of code's own exception are redacted before they are recorded."""
    if isinstance(exc, TorenError):
        error: dict[str, object] = {"type": type(exc).__name__, "code": exc.code}
        error["message"] = repair_text(exc.message)
        carried = exc.details.get("traceback") if isinstance(exc, StepFailed) else None
        if isinstance(carried, str) and carried:
            error["traceback"] = carried
        return error
    redactor = Redactor(secrets_from_env(os.environ))
    message = repair_text(redactor.text(str(exc)))
    error = {"type": type(exc).__name__, "code": "agent_error", "message": message}
    text = trimmed_traceback(exc, redactor)
    if text:
        error["traceback"] = repair_text(text)
    return error


def tagged(exc: StepFailed, seq: int) -> StepFailed:
    """Mark ``exc`` as the failure recorded by event ``seq`` (see :func:`failed_seqs`)."""
    setattr(exc, _SEQ, seq)
    return exc


def failed_seqs(exc: BaseException) -> list[int]:
    """The recorded step failures behind ``exc``: its own and those of the exceptions it
    was raised from or while handling (a failed child's error is raised from the child's
    own failure). What a retry of the run it ended runs again."""
    seqs: list[int] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        seq = getattr(current, _SEQ, None)
        if isinstance(seq, int) and seq not in seqs:
            seqs.append(seq)
        current = current.__cause__ or current.__context__
    return seqs
