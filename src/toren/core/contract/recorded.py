"""Recorded requests read back from the log: every step's digested inputs, re-assembled
from its events and the ``blobs`` table exactly as ``docs/digest.md`` specifies, for
``toren runs verify`` (re-derive every digest) and for saying what changed when a
request differs (``toren plan``, invalidations in the console).

Nothing here writes: it is a fold over stored events plus a read of the blobs they
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toren.core.contract.digest import message_hash, message_list_node, tool_spec_hash
from toren.core.contract.events import (
    ChildStarted,
    Event,
    MessageReceived,
    ModelCallRecorded,
    RunWaiting,
    TimerScheduled,
    ToolCallRecorded,
    UnknownEvent,
    ValueRecorded,
)
from toren.core.contract.ports import BlobStore
from toren.core.contract.values import StepKind

# The event that opens each kind of step (its first event); the others complete a step.
_KIND_OF_FIRST = {
    "ModelCallRecorded": StepKind.MODEL,
    "ToolCallRecorded": StepKind.TOOL,
    "ValueRecorded": StepKind.VALUE,
    "ChildStarted": StepKind.CHILD,
    "MessageReceived": StepKind.MESSAGE,
}
_OPENS = frozenset({*_KIND_OF_FIRST, "TimerScheduled"})
_MAX_CHAIN = 1_000_000  # list nodes followed at most (a cycle in a corrupt log ends here)


@dataclass
class RecordedStep:
    """The events of one step: (stream, generation, position), in seq order."""

    stream: str
    generation: int
    position: int
    events: list[Event] = field(default_factory=list)

    @property
    def first(self) -> Event:
        """The event that opened the step (its request). An event of a type this release
        does not know, written at the same position by a newer one, is passed over."""
        for event in self.events:
            if event.type in _OPENS:
                return event
        return self.events[0]

    @property
    def kind(self) -> StepKind | None:
        first = self.first
        if isinstance(first.payload, TimerScheduled):
            purpose = first.payload.purpose
            return StepKind.MESSAGE if purpose == StepKind.MESSAGE else StepKind.SLEEP
        return _KIND_OF_FIRST.get(first.type)


def group_steps(events: Iterable[Event]) -> list[RecordedStep]:
    """Every step of a log (superseded ones included), in the order they were opened."""
    steps: dict[tuple[str, int, int], RecordedStep] = {}
    for event in sorted(events, key=lambda e: e.seq):
        if event.position is None or event.type == "StreamInvalidated":
            continue
        key = (event.stream, event.generation, event.position)
        step = steps.get(key)
        if step is None:
            step = steps[key] = RecordedStep(event.stream, event.generation, event.position)
        step.events.append(event)
    return list(steps.values())


def waited_names(events: Iterable[Event]) -> list[str]:
    """Names the run was recorded waiting for (``RunWaiting.messages``) or receiving:
    the candidates for a 0.1 timed wait, whose log does not record its name."""
    names: dict[str, None] = {}
    for event in events:
        if isinstance(event.payload, RunWaiting):
            names.update(dict.fromkeys(str(n) for n in event.payload.messages))
        elif isinstance(event.payload, MessageReceived):
            names[event.payload.name] = None
    return list(names)


# -- blobs --------------------------------------------------------------------------------


async def load_blobs(store: BlobStore, events: Sequence[Event]) -> dict[str, object]:
    """Every blob the model calls of ``events`` reference: their message-list nodes (the
    whole chains), message bodies and tool specs. Missing ones are simply absent."""
    found: dict[str, object] = {}
    asked: set[str] = set()
    calls = [e.payload for e in events if isinstance(e.payload, ModelCallRecorded)]
    wanted = {c.message_list for c in calls if c.message_list} | {
        t for c in calls for t in c.tools if isinstance(t, str)
    }
    for _ in range(_MAX_CHAIN):
        todo = sorted(wanted - asked)
        if not todo:
            break
        asked.update(todo)
        for i in range(0, len(todo), 500):
            found.update(await store.get_blobs(todo[i : i + 500]))
        wanted = set()
        for key in todo:
            body = found.get(key)
            if isinstance(body, Mapping) and set(body) == {"prev", "items"}:
                items = body["items"] if isinstance(body["items"], list) else []
                wanted.update(h for h in items if isinstance(h, str))
                if isinstance(body["prev"], str):
                    wanted.add(body["prev"])
    return found


# -- deriving a step's request ------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A request body the log supports, and how it was read (None: read as recorded)."""

    body: dict[str, Any]
    note: str | None = None


@dataclass(frozen=True)
class Derived:
    """What the log says a step asked: its kind and the candidate bodies of its digest
    (one, except for 0.1 logs that lost a detail), or why it cannot be re-derived
    (``problem``) or why it cannot be trusted (``tampered``: a stored blob that does not
    hash to its address)."""

    kind: StepKind | None
    candidates: tuple[Candidate, ...] = ()
    problem: str | None = None
    tampered: str | None = None
    # Model calls: (message hash, role) and (tool hash, tool name) for saying what changed.
    messages: tuple[tuple[str, str | None], ...] = ()
    tools: tuple[tuple[str, str | None], ...] = ()


def derive(step: RecordedStep, blobs: Mapping[str, object], names: Sequence[str] = ()) -> Derived:
    kind = step.kind
    payload = step.first.payload
    if isinstance(payload, UnknownEvent) or kind is None:
        return Derived(
            None,
            problem=f"its first event is of type {step.first.type!r}, which this release "
            "of Toren does not know how to read back",
        )
    if isinstance(payload, ModelCallRecorded):
        return _derive_model(payload, blobs)
    if isinstance(payload, ToolCallRecorded):
        return Derived(kind, (Candidate({"name": payload.name, "args": payload.args}),))
    if isinstance(payload, ValueRecorded):
        return Derived(kind, (Candidate({"what": payload.what}),))
    if isinstance(payload, ChildStarted):
        return Derived(kind, (Candidate({"process": payload.process, "input": payload.input}),))
    if isinstance(payload, MessageReceived):  # a wait without a timeout
        return Derived(kind, (Candidate({"name": payload.name, "timeout": None}),))
    assert isinstance(payload, TimerScheduled)
    if kind == StepKind.SLEEP:
        return Derived(kind, _seconds_candidates(payload, "seconds", lambda s: {"seconds": s}))
    return _derive_timed_wait(step, payload, names)


def _seconds_candidates(payload: TimerScheduled, what: str, body: Any) -> tuple[Candidate, ...]:
    """``requested_seconds`` (since 0.2) is the duration exactly as the code gave it. A 0.1
    log has only ``seconds``; for a sleep it was written as a float (``1.0`` for
    ``sleep(1)``), so an integral value is also tried as the integer the code may have
    given."""
    if payload.requested_seconds is not None:
        return (Candidate(body(payload.requested_seconds)),)
    seconds = payload.seconds
    found = [Candidate(body(seconds))]
    if type(seconds) is float and seconds.is_integer():
        found.append(
            Candidate(
                body(int(seconds)),
                f"read from a log written before 0.2, which records {what} {seconds!r} "
                f"but not how the code spelled it: the code gave the integer {int(seconds)}",
            )
        )
    return tuple(found)


def _derive_timed_wait(
    step: RecordedStep, payload: TimerScheduled, names: Sequence[str]
) -> Derived:
    name: str | None = payload.message
    if name is None:
        received = [e.payload for e in step.events if isinstance(e.payload, MessageReceived)]
        if received:  # the message that completed the wait
            name = received[-1].name
    if name is not None:
        found = _seconds_candidates(payload, "timeout", lambda s: {"name": name, "timeout": s})
        return Derived(StepKind.MESSAGE, found)
    if not names:
        return Derived(
            StepKind.MESSAGE,
            problem="a message wait with a timeout written before 0.2 that received no "
            "message: the log does not record the name waited for, and the run never "
            "recorded waiting for any name",
        )
    how = (
        "read from a log written before 0.2, which does not record the name of a timed "
        "wait that received nothing: the name is one the run recorded waiting for "
        "(RunWaiting.messages)"
    )
    found = tuple(
        Candidate(c.body, how if c.note is None else f"{how}; {c.note}")
        for n in names
        for c in _seconds_candidates(payload, "timeout", lambda s, n=n: {"name": n, "timeout": s})
    )
    return Derived(StepKind.MESSAGE, found, problem=f"none of the names {list(names)} matched")


def _derive_model(payload: ModelCallRecorded, blobs: Mapping[str, object]) -> Derived:
    chain = _message_hashes(payload.message_list, blobs)
    if isinstance(chain, _Bad):
        return Derived(StepKind.MODEL, **chain.fields())
    if len(chain) != payload.message_count:
        return Derived(
            StepKind.MODEL,
            tampered=f"its message list holds {len(chain)} messages, the event says "
            f"message_count {payload.message_count}",
        )
    messages = _named_bodies(chain, blobs, "message", message_hash, "role")
    if isinstance(messages, _Bad):
        return Derived(StepKind.MODEL, **messages.fields())
    tools = _named_bodies(payload.tools, blobs, "tool spec", tool_spec_hash, "name")
    if isinstance(tools, _Bad):
        return Derived(StepKind.MODEL, **tools.fields())
    body = {
        "provider": payload.provider,
        "model": payload.model,
        "messages": list(chain),
        "tools": list(payload.tools),
        "params": payload.params,
    }
    return Derived(StepKind.MODEL, (Candidate(body),), messages=tuple(messages), tools=tuple(tools))


@dataclass(frozen=True)
class _Bad:
    problem: str | None = None
    tampered: str | None = None

    def fields(self) -> dict[str, Any]:
        return {"problem": self.problem, "tampered": self.tampered}


def _named_bodies(
    addresses: Sequence[str],
    blobs: Mapping[str, object],
    what: str,
    address_of: Callable[[Any], str],
    label: str,
) -> list[tuple[str, str | None]] | _Bad:
    """Each address with its body's ``label`` field (a message's role, a tool's name),
    after checking the body is stored and hashes to its address."""
    found: list[tuple[str, str | None]] = []
    for i, address in enumerate(addresses):
        if address not in blobs:
            return _Bad(problem=f"{what} {i} (blob {address}) is missing")
        body = blobs[address]
        if not isinstance(body, Mapping) or address_of(body) != address:
            return _Bad(
                tampered=f"{what} {i}: the stored body of blob {address} does not hash "
                "to that address"
            )
        value = body.get(label)
        found.append((address, value if isinstance(value, str) else None))
    return found


def _message_hashes(node: str | None, blobs: Mapping[str, object]) -> list[str] | _Bad:
    chain: list[list[str]] = []
    seen: set[str] = set()
    while node is not None:
        if node in seen:
            return _Bad(tampered=f"message list node {node} is part of a cycle")
        seen.add(node)
        if node not in blobs:
            return _Bad(problem=f"message list node {node} is missing from blobs")
        body = blobs[node]
        items, prev = (
            (body.get("items"), body.get("prev")) if isinstance(body, Mapping) else ("", 0)
        )
        if (
            not isinstance(items, list)
            or not all(isinstance(h, str) for h in items)
            or not (prev is None or isinstance(prev, str))
            or message_list_node(prev, items)[0] != node
        ):
            return _Bad(
                tampered=f"message list node {node}: its stored body does not hash to that address"
            )
        chain.append(items)
        node = prev
    return [h for items in reversed(chain) for h in items]
