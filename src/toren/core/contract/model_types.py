"""The values of a model call: what crosses the provider boundary and the durable one.

A provider turns a :class:`ModelRequest` into a :class:`ModelResponse`; the engine digests
the request and records the response. These frozen, JSON-serialisable values are defined
here, below both, so that the engine (``toren.core``) and the stores never import a
provider package; ``toren.providers`` re-exports them, where users import them from.

Toren's message format (provider-neutral; each provider converts it to its wire format)::

    {"role": "system",    "content": "..."}
    {"role": "user",      "content": "..."}
    {"role": "assistant", "content": "...",
     "tool_calls": [{"id": "c1", "name": "f", "arguments": {...}}]}
    {"role": "tool",      "tool_call_id": "c1", "name": "f", "content": "..."}
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")

MessageLike = Mapping[str, Any]  # a plain dict or a Message
DeltaCallback = Callable[[str], None]

# Request parameters that change *how* a call is made, never *what* it asks. They are
# stripped before digesting: changing a timeout must not invalidate an in-flight run.
TRANSPORT_PARAMS = frozenset(
    {
        "api_key",
        "base_url",
        "headers",
        "extra_headers",
        "timeout",
        "max_retries",
        "retries",
        "retry",
        "stream",
        "organization",
        "project",
    }
)


class Message(dict[str, Any]):
    """An immutable message (a ``dict`` that refuses changes, nested values frozen too).

    Toren hashes each message of a request; an immutable message is hashed once and then
    recognised by identity, so a long conversation costs each step only its new messages.
    Plain dicts work too, but are re-checked on every call (time grows with history).
    ``ModelResponse.message()`` returns one; build your own with ``Message(role=...,
    content=...)``.
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key, value in dict.items(self):
            dict.__setitem__(self, key, _freeze(value))

    def _immutable(self, *_: Any, **__: Any) -> Any:
        raise TypeError("a toren Message is immutable; build a new one instead")

    __setitem__ = __delitem__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable
    __ior__ = _immutable

    def __reduce__(self) -> Any:
        return (Message, (dict(self),))

    def __copy__(self) -> Message:
        return self

    def __deepcopy__(self, memo: Any) -> Message:
        return self


class FrozenList(list[Any]):
    """A list that refuses changes (the nested lists of a :class:`Message`). A ``list``
    subclass, so it still compares equal to a plain list and serialises as one."""

    __slots__ = ()

    def _immutable(self, *_: Any, **__: Any) -> Any:
        raise TypeError("a toren Message is immutable; build a new one instead")

    __setitem__ = __delitem__ = _immutable
    __iadd__ = __imul__ = _immutable
    append = extend = insert = pop = remove = clear = sort = reverse = _immutable

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))


def _freeze(value: Any) -> Any:
    if isinstance(value, (Message, FrozenList)):
        return value
    if isinstance(value, Mapping):
        return Message(dict(value))
    if isinstance(value, (list, tuple)):
        return FrozenList(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, a description and a JSON Schema of arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass(frozen=True)
class ModelRequest:
    """The exact request of a model call. ``params`` holds sampling parameters
    (temperature, max_tokens, ...). Transport settings live in the provider's config."""

    provider: str
    model: str
    messages: tuple[MessageLike, ...]
    tools: tuple[ToolSpec, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asked to call.

    ``arguments_error`` is set when the model wrote arguments that are not a JSON object
    (invalid JSON, or a list, string, ...). That is the model's mistake, not a failed
    call: the call was served and billed, so the response is recorded as usual, with
    ``arguments`` empty, ``raw_arguments`` the text as the model wrote it and
    ``arguments_error`` what is wrong with it, worded for the model. The built-in loop
    answers such a call with that error instead of running the tool, so the model can
    correct itself. Agent code that runs tools itself should do the same.
    """

    id: str
    name: str
    arguments: Mapping[str, Any]
    arguments_error: str | None = None
    raw_arguments: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}
        # Only when set: the assistant message of a response carries these dicts into
        # every later request of the run, so a new key on every call would change those
        # requests' digests and re-run (and re-bill) every in-flight run.
        if self.arguments_error is not None:
            data["arguments_error"] = self.arguments_error
            data["raw_arguments"] = self.raw_arguments
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        error, raw = data.get("arguments_error"), data.get("raw_arguments")
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            arguments=dict(data.get("arguments") or {}),
            arguments_error=None if error is None else str(error),
            raw_arguments=None if raw is None else str(raw),
        )


def frozen(cls: type[_T], base: Mapping[str, Any] = {}, /, **values: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` from *every* field's value (``base``,
    then ``values`` over it), built without its ``__init__`` (which costs a ``setattr`` per
    field): for the hot paths that make one per step. Only for classes without
    ``__post_init__``."""
    obj = object.__new__(cls)
    obj.__dict__.update(base, **values)
    return obj


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class ModelResponse:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    model: str = ""

    def message(self) -> Message:
        """The assistant message to append to the conversation (immutable)."""
        if self.tool_calls:
            return Message(
                role="assistant",
                content=self.text,
                tool_calls=[c.to_dict() for c in self.tool_calls],
            )
        return Message(role="assistant", content=self.text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": self.usage.to_dict(),
            "finish_reason": self.finish_reason,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResponse:
        usage = data.get("usage") or {}
        calls = data.get("tool_calls")
        return frozen(
            cls,
            text=str(data.get("text", "")),
            tool_calls=tuple(ToolCall.from_dict(c) for c in calls) if calls else (),
            usage=frozen(
                Usage,
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
            ),
            finish_reason=str(data.get("finish_reason", "stop")),
            model=str(data.get("model", "")),
        )


class CancelledWithUsage(asyncio.CancelledError):
    """A model call cancelled (a drain window that ran out, a step timeout) after the
    provider had reported usage for it: Anthropic's ``message_start`` gives the input
    tokens before any text, and a stream's usage events the output so far. A
    ``CancelledError`` still, so cancellation works as ever; the engine counts ``usage``
    in the run's cost, since the provider bills a call it has begun to answer."""

    def __init__(self, usage: Usage) -> None:
        super().__init__("model call cancelled after the provider reported usage")
        self.usage = usage


def usage_cut_off(exc: BaseException | None) -> Usage | None:
    """The usage of a model call cut off by ``exc``: a :class:`CancelledWithUsage`, or
    the ``TimeoutError`` ``asyncio.wait_for``/``asyncio.timeout`` raised from one."""
    while exc is not None:
        if isinstance(exc, CancelledWithUsage):
            return exc.usage
        exc = exc.__cause__ or exc.__context__
    return None
