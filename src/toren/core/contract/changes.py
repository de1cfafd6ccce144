"""Say what changed between two requests of a step, part by part, instead of only showing
two digests. A model request is digested over its message hashes one by one, its tool-spec
hashes and its parameters, so the parts that differ can be named: "message 0 (system)
changed", "tool 'get_weather': spec changed", "parameter temperature 0.2 -> 0.7".

The recorded side comes from the log (:mod:`toren.core.contract.recorded`); the other side is either
the request the current code makes (``toren plan``) or the request recorded after an
invalidation at the same position (the console's and the API's view of a
``StreamInvalidated``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toren.core.contract.digest import HashedRequest, canonical_json
from toren.core.contract.events import Event, StreamInvalidated
from toren.core.contract.model_types import ModelRequest
from toren.core.contract.recorded import Derived, RecordedStep, derive, group_steps, waited_names
from toren.core.contract.values import InvalidationCause, StepKind

_SHOWN = 60  # characters of a value shown in a change's text


@dataclass(frozen=True)
class RequestParts:
    """The digested parts of one step request. ``fields`` is the body but, for a model
    call, its messages and tools, which are listed with their role and name."""

    kind: StepKind
    fields: Mapping[str, Any]
    messages: tuple[tuple[str, str | None], ...] = ()
    tools: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Change:
    part: str  # kind | provider | model | message | tool | param | argument | <body field>
    text: str
    name: str | None = None
    index: int | None = None
    old: object = None
    new: object = None

    def to_dict(self) -> dict[str, object]:
        return {
            "part": self.part,
            "text": self.text,
            "name": self.name,
            "index": self.index,
            "old": self.old,
            "new": self.new,
        }


def live_model_parts(request: ModelRequest, hashed: HashedRequest) -> RequestParts:
    """The parts of a model request the current code makes."""
    roles = [m.get("role") for m in request.messages]
    return RequestParts(
        StepKind.MODEL,
        {"provider": request.provider, "model": request.model, "params": hashed.params},
        tuple(
            (h, r if isinstance(r, str) else None)
            for h, r in zip(hashed.messages, roles, strict=True)
        ),
        tuple((h, t.name) for h, t in zip(hashed.tools, request.tools, strict=True)),
    )


def body_parts(kind: StepKind, body: Mapping[str, object]) -> RequestParts:
    return RequestParts(kind, dict(body))


def recorded_parts(derived: Derived) -> RequestParts | None:
    """The parts of a recorded request (None when the log cannot say)."""
    if derived.kind is None or not derived.candidates:
        return None
    body = derived.candidates[0].body
    if derived.kind != StepKind.MODEL:
        return RequestParts(derived.kind, body)
    fields = {k: body[k] for k in ("provider", "model", "params")}
    return RequestParts(StepKind.MODEL, fields, derived.messages, derived.tools)


def diff(old: RequestParts, new: RequestParts) -> list[Change]:
    """The parts that differ, in the order of the request (empty: the same request)."""
    if old.kind != new.kind:
        was, now = str(old.kind), str(new.kind)  # plain strings in the JSON shown
        return [Change("kind", f"step kind {was} -> {now}", old=was, new=now)]
    if old.kind == StepKind.TOOL:
        a, b = old.fields.get("args"), new.fields.get("args")
        named = _dict_changes({"name": old.fields.get("name")}, {"name": new.fields.get("name")})
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return named + _dict_changes(a, b, "argument")
        return named + _dict_changes({"args": a}, {"args": b})
    if old.kind != StepKind.MODEL:
        return _dict_changes(old.fields, new.fields)
    found: list[Change] = []
    for part in ("provider", "model"):
        a, b = old.fields.get(part), new.fields.get(part)
        if a != b:
            found.append(Change(part, f"{part} {a} -> {b}", old=a, new=b))
    found += _message_changes(old.messages, new.messages)
    found += _tool_changes(old.tools, new.tools)
    found += _dict_changes(old.fields.get("params") or {}, new.fields.get("params") or {}, "param")
    return found


def _message_changes(
    old: Sequence[tuple[str, str | None]], new: Sequence[tuple[str, str | None]]
) -> list[Change]:
    found = []
    for i in range(max(len(old), len(new))):
        if i >= len(new):
            what, role = "removed", old[i][1]
        elif i >= len(old):
            what, role = "added", new[i][1]
        elif old[i][0] != new[i][0]:
            what, role = "changed", new[i][1]
        else:
            continue
        shown = "the system prompt" if role == "system" else role
        label = f"message {i}" + (f" ({shown})" if shown else "")
        found.append(Change("message", f"{label} {what}", name=role, index=i, old=what))
    return found


def _tool_changes(
    old: Sequence[tuple[str, str | None]], new: Sequence[tuple[str, str | None]]
) -> list[Change]:
    before = {name or h: h for h, name in old}
    after = {name or h: h for h, name in new}
    found = []
    for name in [*before, *(n for n in after if n not in before)]:
        if name not in after:
            found.append(Change("tool", f"tool {name!r} removed", name=name, old=before[name]))
        elif name not in before:
            found.append(Change("tool", f"tool {name!r} added", name=name, new=after[name]))
        elif before[name] != after[name]:
            text = f"tool {name!r}: spec changed"
            found.append(Change("tool", text, name=name, old=before[name], new=after[name]))
    if not found and [h for h, _ in old] != [h for h, _ in new]:
        found.append(Change("tool", "the order of the tools changed"))
    return found


def _dict_changes(
    old: Mapping[str, object], new: Mapping[str, object], label: str | None = None
) -> list[Change]:
    found = []
    for key in sorted({*old, *new}):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a is not _ABSENT and b is not _ABSENT and _same(a, b):
            continue
        part = label or key
        head = f"{_WORDS.get(label, label)} {key}" if label else key
        if a is _ABSENT:
            text = f"{head} added ({_show(b)})"
        elif b is _ABSENT:
            text = f"{head} removed (was {_show(a)})"
        else:
            text = f"{head} {_show(a)} -> {_show(b)}"
        found.append(
            Change(
                part,
                text,
                name=key,
                old=None if a is _ABSENT else a,
                new=None if b is _ABSENT else b,
            )
        )
    return found


_ABSENT: object = object()
_WORDS = {"param": "parameter"}


def _same(a: object, b: object) -> bool:
    """Equal as the digest sees it: 1, 1.0 and True are three different values."""
    try:
        return canonical_json(a) == canonical_json(b)
    except Exception:
        return False


def _show(value: object) -> str:
    try:
        text = canonical_json(value).decode("utf-8")
    except Exception:
        text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


# -- invalidations in a recorded log ------------------------------------------------------


def explain_invalidations(
    events: Sequence[Event], blobs: Mapping[str, object]
) -> list[dict[str, object]]:
    """For every ``StreamInvalidated`` of a run's log, what differs between the superseded
    request at ``from_pos`` and the request recorded there afterwards (when the new step
    has been recorded: a run invalidated by a deploy and not yet resumed has none)."""
    at: dict[tuple[str, int], list[RecordedStep]] = {}
    for step in group_steps(events):  # in seq order
        at.setdefault((step.stream, step.position), []).append(step)
    names = waited_names(events)
    found = []
    for event in events:
        payload = event.payload
        if not isinstance(payload, StreamInvalidated):
            continue
        entry: dict[str, object] = {
            "seq": event.seq,
            "stream": event.stream,
            "from_pos": payload.from_pos,
            "cause": payload.cause,
            "changes": [],
            "note": None,
        }
        # The step the invalidation superseded is the last one opened at that position
        # before it (of this generation or an older one); the new request is the first
        # one opened there after it.
        here = at.get((event.stream, payload.from_pos), [])
        before = next((s for s in reversed(here) if s.first.seq < event.seq), None)
        after = next(
            (s for s in here if s.first.seq > event.seq and s.generation > event.generation),
            None,
        )
        entry["changes"], entry["note"] = _explain(payload, before, after, blobs, names)
        found.append(entry)
    return found


def _explain(
    payload: StreamInvalidated,
    before: RecordedStep | None,
    after: RecordedStep | None,
    blobs: Mapping[str, object],
    names: Sequence[str],
) -> tuple[list[dict[str, object]], str | None]:
    if payload.cause == InvalidationCause.PARENT_INVALIDATED:
        return [], "the step that spawned this stream was invalidated"
    if payload.cause == InvalidationCause.STREAM_ENDED:
        return [], f"the new code ends the stream before position {payload.from_pos}"
    if before is None:
        return [], "the superseded step is not in the log"
    if after is None:
        return [], "the new request has not been recorded yet (the step has not run again)"
    old = recorded_parts(derive(before, blobs, names))
    new = recorded_parts(derive(after, blobs, names))
    if old is None or new is None:
        return [], "the log does not hold both requests in full"
    return [c.to_dict() for c in diff(old, new)], None
