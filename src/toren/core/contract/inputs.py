"""What a run's input and a message's payload may be: JSON data at most
:data:`MAX_JSON_DEPTH` levels deep. The one definition every entry point uses: the host API
(:func:`toren.start_run`, :func:`toren.send_message`), the HTTP API's request models and
the CLI (``toren run``, ``toren runs send``), so all of them accept the same values and
refuse the rest with the same words, before anything is stored.

Depth counts objects and arrays: ``"x"`` is 0 levels, ``{"a": [1]}`` is 2. Measured
without recursion, on a value (:func:`check_depth`) or, for JSON text too deep for
Python's parser (about a thousand levels), on the text itself (:func:`loads`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from toren.core.contract.text import has_surrogates
from toren.errors import InvalidInput

__all__ = [
    "MAX_JSON_DEPTH",
    "MESSAGE_NAME_HELP",
    "MESSAGE_NAME_PATTERN",
    "check_depth",
    "check_message_name",
    "format_path",
    "json_data",
    "loads",
    "text_depth",
    "too_deep",
]

# Far more than any real input needs, and far below what the response serializer and the
# redactor's bound (toren.redact.MAX_DEPTH, 128) take, so what was sent can always be read
# back whole. docs/http-api.md and docs/cli.md document it; lowering it would be breaking.
MAX_JSON_DEPTH = 64

Segment = str | int

# A message name (``ctx.wait_for_message(name)``): stored as text on both backends, shown in
# logs and the console; PostgreSQL refuses NUL in text.
MESSAGE_NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,255}$"
MESSAGE_NAME_HELP = "1 to 255 characters, without control characters (no newline, tab, NUL)"
_MESSAGE_NAME = re.compile(MESSAGE_NAME_PATTERN)


def check_message_name(name: object) -> str:
    """``name`` if it is a valid message name, else :class:`InvalidInput` saying why.
    ``fullmatch``: re's ``$`` also matches before a final newline, pydantic's does not."""
    if not isinstance(name, str) or not _MESSAGE_NAME.fullmatch(name):
        raise InvalidInput(f"message name {name!r} is not valid; expected {MESSAGE_NAME_HELP}")
    return name


def check_depth(value: object, what: str, root: str) -> None:
    """Raise :class:`InvalidInput` if ``value`` nests objects and arrays more than
    :data:`MAX_JSON_DEPTH` levels deep. ``what`` names the value in the message ("run
    input"), ``root`` starts the path to the place ("input")."""
    heights = _heights(value)
    if heights is None:  # a value that contains itself: json.dumps names the cycle
        return
    depth = heights.get(id(value), 0)
    if depth > MAX_JSON_DEPTH:
        raise too_deep(what, root, depth, _path_to_level(value, heights, MAX_JSON_DEPTH + 1))


def json_data(value: object, what: str, root: str) -> Any:
    """``value`` as it will be stored (a plain JSON copy), or :class:`InvalidInput`: too
    deep, not JSON data (another type, NaN or an infinity), or not storable as UTF-8."""
    check_depth(value, what, root)
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        try:
            text.encode("utf-8")  # lone surrogates cannot be stored
        except UnicodeEncodeError:
            raise InvalidInput(_not_unicode(value, what, root)) from None
        return json.loads(text)
    except RecursionError:
        # Not too deep (checked above): a value that contains itself, deeper than json
        # recurses before it can name the cycle.
        raise InvalidInput(
            f"{what} must be JSON data (objects, arrays, strings, numbers, booleans, null); "
            "got a value that contains itself"
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"{what} must be JSON data (objects, arrays, strings, numbers, booleans, null); "
            f"got a value that is not: {exc}"
        ) from None


def _not_unicode(value: object, what: str, root: str) -> str:
    """The message refusing a value with a string that is not valid Unicode, naming where
    (see toren.core.contract.text: what comes from a caller is refused, before anything is paid)."""
    stack: list[tuple[object, tuple[Segment, ...]]] = [(value, ())]
    where = root
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if has_surrogates(item):
                where = format_path(root, path)
                break
        elif isinstance(item, dict):
            for k, v in item.items():
                if has_surrogates(k):
                    where = format_path(root, path) + " (a key)"
                    stack.clear()
                    break
                stack.append((v, (*path, k)))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, (*path, i)) for i, v in enumerate(item))
    return (
        f"{what} must be valid Unicode text: the string at {where} holds a lone surrogate "
        "(half of a UTF-16 pair, e.g. '\\ud83d'), which cannot be stored; send the whole "
        "character, or U+FFFD in its place"
    )


def loads(text: str, what: str, root: str) -> object:
    """``json.loads(text)``, its value checked with :func:`check_depth`. Text nested too
    deeply for Python's parser is measured as text and refused in the same words.
    A malformed text raises ``ValueError`` as ``json.loads`` does."""
    try:
        value = json.loads(text)
    except RecursionError:
        depth, path = text_depth(text, MAX_JSON_DEPTH + 1)
        raise too_deep(what, root, depth, path) from None
    check_depth(value, what, root)
    return value


def too_deep(what: str, root: str, depth: int, path: Sequence[Segment]) -> InvalidInput:
    """The error for a value ``depth`` levels deep, the first level past the limit at
    ``path``: what is wrong, where, and what is expected."""
    return InvalidInput(
        f"{what} nests objects and arrays {depth} levels deep (level {MAX_JSON_DEPTH + 1} "
        f"at {format_path(root, path)}); expected at most {MAX_JSON_DEPTH} levels",
        depth=depth,
        limit=MAX_JSON_DEPTH,
    )


def format_path(root: str, path: Sequence[Segment], *, head: int = 8, tail: int = 2) -> str:
    """``input[0].a["b c"]``; a long path keeps its first ``head`` and last ``tail`` steps."""
    parts = [f"[{s}]" if isinstance(s, int) else _key(s) for s in path]
    if len(parts) > head + tail + 1:
        parts = [*parts[:head], " ... ", *parts[-tail:]]
    return root + "".join(parts)


def _key(key: str) -> str:
    return f".{key}" if _IDENTIFIER.match(key) else f"[{json.dumps(key, ensure_ascii=False)}]"


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTAINERS = (dict, list, tuple)


def _children(node: Any) -> Iterator[tuple[Segment, Any]]:
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in items:
        if isinstance(child, _CONTAINERS):
            yield (key if isinstance(key, int) else str(key)), child


def _heights(value: object) -> dict[int, int] | None:
    """How many levels each container of ``value`` holds (itself included), by ``id``; a
    container shared by several parents is measured once. None if ``value`` contains
    itself. Iterative: no depth makes it raise ``RecursionError``."""
    heights: dict[int, int] = {}
    if not isinstance(value, _CONTAINERS):
        return heights
    open_: set[int] = set()  # entered, not finished: the containers around the current one
    stack: list[tuple[object, bool]] = [(value, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_.discard(key)
            below = [heights[id(child)] for _, child in _children(node)]
            heights[key] = 1 + max(below, default=0)
        elif key in open_:
            return None
        elif key not in heights:
            open_.add(key)
            stack.append((node, True))
            stack.extend((child, False) for _, child in _children(node))
    return heights


def _path_to_level(value: object, heights: dict[int, int], level: int) -> list[Segment]:
    """The path to the first container (in document order) at ``level``."""
    path: list[Segment] = []
    node, at = value, 1
    while at < level:
        for key, child in _children(node):
            if at + heights[id(child)] >= level:
                path.append(key)
                node, at = child, at + 1
                break
    return path


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.DOTALL)


def text_depth(text: str, level: int) -> tuple[int, list[Segment]]:
    """The depth of JSON ``text``, and the path to its first container at ``level`` (empty
    if none is that deep). Reads only the structure: strings, brackets, commas, colons."""
    depth = 0
    found: list[Segment] = []
    path: list[Segment] = []  # to the innermost open container
    frames: list[list[Any]] = []  # per open container: [is_object, key or index]
    last = ""
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            if frames:
                step = frames[-1][1]
                path.append("?" if step is None else step)  # "?": malformed, a value without a key
            frames.append([token == "{", None if token == "{" else 0])
            depth = max(depth, len(frames))
            if len(frames) == level and not found:
                found = list(path)
        elif token in "]}":
            if frames:
                frames.pop()
            if frames and path:  # the closed container was not the root: leave its step
                path.pop()
        elif not frames:
            continue
        elif token == ",":
            frames[-1][1] = None if frames[-1][0] else frames[-1][1] + 1
        elif token == ":":
            frames[-1][1] = last
        else:
            last = _string(token)
    return depth, found


def _string(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:
        return token[1:-1]
