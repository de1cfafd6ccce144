"""Wire-format helpers shared by the vendor providers."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from toren.errors import InvalidInput
from toren.providers.base import TRANSPORT_PARAMS, MessageLike, ModelRequest, ToolCall

# Sampling settings Anthropic's messages API refuses (400) on every model since API
# version 2026-10-21, the version the anthropic SDK 2.x sends (its ``messages.create`` has
# no such parameters any more; pydantic-ai drops them with a warning for the same reason).
ANTHROPIC_REFUSED = ("temperature", "top_k", "top_p")
ANTHROPIC_REFUSING_VERSION = "2026-10-21"


def anthropic_refused(params: Mapping[str, object]) -> list[str]:
    """The sampling settings in ``params`` that Anthropic's API refuses."""
    return [key for key in ANTHROPIC_REFUSED if key in params]


ANTHROPIC_REFUSAL = (
    f"Anthropic's messages API (version {ANTHROPIC_REFUSING_VERSION}, which the anthropic "
    "SDK Toren uses sends) refuses temperature, top_k and top_p on every model"
)


def sampling_params(request: ModelRequest) -> dict[str, object]:
    """``request.params`` minus transport settings, which the provider's own config owns
    (a ``stream`` or ``timeout`` smuggled in here would fight the provider's)."""
    return {k: v for k, v in request.params.items() if k not in TRANSPORT_PARAMS}


def require(message: MessageLike, key: str) -> object:
    if key not in message:
        role = message.get("role")
        raise InvalidInput(
            f"a {role!r} message needs a {key!r} field; got keys {sorted(message)!r}. "
            "See the message format in toren.providers.base."
        )
    return message[key]


def content_text(content: object) -> str:
    """Tool results may be any JSON value; the wire wants a string."""
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content)


# How much of garbled arguments an error quotes back to the model (``raw_arguments`` keeps
# them whole): enough to see the mistake, not a second copy of a long document.
QUOTED_ARGUMENTS = 500


def tool_call(call_id: str, name: str, text: str) -> ToolCall:
    """A tool call from the arguments text the model wrote (OpenAI's ``arguments``, the
    Anthropic stream's ``partial_json``). Text that is not a JSON object is the model's
    mistake and is carried on the call (see :class:`ToolCall`), never raised: the call
    was served and billed."""
    try:
        value = (
            json.loads(text, parse_constant=_not_json, parse_float=_finite) if text.strip() else {}
        )
    except (ValueError, RecursionError) as exc:
        return _garbled(call_id, name, text, f"not valid JSON ({exc})")
    return tool_call_from_value(call_id, name, value, text)


def tool_call_from_value(
    call_id: str, name: str, value: object, text: str | None = None
) -> ToolCall:
    """A tool call from arguments the SDK already decoded (Anthropic's ``input``)."""
    if isinstance(value, Mapping):
        number = _non_finite(value)
        if number is None:
            return ToolCall(call_id, name, dict(value))
        # The SDK decodes NaN, Infinity and 1e999 (as inf) without complaint.
        raw = json.dumps(value) if text is None else text
        return _garbled(call_id, name, raw, f"not valid JSON ({number!r} is not a JSON value)")
    raw = json.dumps(value) if text is None else text
    return _garbled(call_id, name, raw, f"a JSON {_json_kind(value)}, not an object")


def _not_json(constant: str) -> object:
    # NaN and Infinity are not JSON: recorded, they would fail the next request's digest.
    raise ValueError(f"{constant} is not a JSON value")


def _finite(text: str) -> float:
    # A number too large for a float (1e999) reads as inf: the same failure as Infinity.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _non_finite(value: object) -> float | None:
    """The first NaN or infinity in decoded arguments, or None. Iterative: the SDK may
    hand over deeply nested input."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def _json_kind(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


def _garbled(call_id: str, name: str, raw: str, problem: str) -> ToolCall:
    shown = repr(raw[:QUOTED_ARGUMENTS])
    if len(raw) > QUOTED_ARGUMENTS:
        shown += f" (the first {QUOTED_ARGUMENTS} of {len(raw)} characters)"
    return ToolCall(call_id, name, {}, arguments_error=f"{problem}: {shown}", raw_arguments=raw)
