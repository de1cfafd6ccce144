"""Wire-format helpers shared by the vendor providers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toren.errors import InvalidInput
from toren.providers.base import TRANSPORT_PARAMS, MessageLike, ModelRequest


def sampling_params(request: ModelRequest) -> dict[str, Any]:
    """``request.params`` minus transport settings, which the provider's own config owns
    (a ``stream`` or ``timeout`` smuggled in here would fight the provider's)."""
    return {k: v for k, v in request.params.items() if k not in TRANSPORT_PARAMS}


def require(message: MessageLike, key: str) -> Any:
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


def arguments_object(raw: str, tool: str) -> dict[str, Any]:
    """Decode tool-call arguments, which the model (not the SDK) wrote as JSON text.
    Raises ``ValueError`` for anything but a JSON object."""
    value = json.loads(raw) if raw.strip() else {}
    if not isinstance(value, Mapping):
        raise ValueError(f"arguments of tool call {tool!r} are not a JSON object: {raw[:200]!r}")
    return dict(value)
