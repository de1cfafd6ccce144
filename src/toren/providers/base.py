"""The provider interface: the Protocol a provider implements and its retry policy.

A provider turns a :class:`ModelRequest` into a :class:`ModelResponse`. It knows nothing about the
journal; durability wraps it (``toren.core``). The values that cross it are defined in
:mod:`toren.core.contract.model_types` and the Protocol in :mod:`toren.core.contract.ports` (the
engine owns the ports it calls through); both are re-exported here, where providers and users import
them from.
"""

from __future__ import annotations

from dataclasses import dataclass

from toren.core.contract.model_types import (
    TRANSPORT_PARAMS,
    CancelledWithUsage,
    DeltaCallback,
    FrozenList,
    Message,
    MessageLike,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
    frozen,
    usage_cut_off,
)
from toren.core.contract.ports import ModelProvider

__all__ = [
    "TRANSPORT_PARAMS",
    "CancelledWithUsage",
    "DeltaCallback",
    "FrozenList",
    "Message",
    "MessageLike",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "frozen",
    "usage_cut_off",
]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries on 408, 409, 429 and 5xx unless the server's ``x-should-retry`` says
    otherwise, as the vendor SDKs do.

    A wait the server asks for (``retry-after-ms``, else ``Retry-After`` in seconds) wins
    over the backoff and is waited in full up to ``max_retry_after`` (two minutes, the
    OpenAI SDK's cap). A longer one fails the call at once, saying how long the server
    asked to wait: retrying earlier would only hammer a server that asked us to wait.

    The backoff grows by ``multiplier`` from ``initial_backoff`` up to ``max_backoff``,
    and each wait is cut by a random part of up to ``jitter`` of it (0.25: a factor in
    (0.75, 1], as the OpenAI and Anthropic SDKs draw it), so that the clients a failure
    hit together do not all come back at the same instant.
    """

    max_attempts: int = 4
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    multiplier: float = 2.0
    jitter: float = 0.25
    max_retry_after: float = 120.0

    def backoff(self, attempt: int, rand: float = 0.0) -> float:
        """Seconds to wait before retry ``attempt`` (0-based). ``rand``, a draw in [0, 1),
        picks the point in the jitter range; 0 gives the full backoff."""
        try:
            full = min(self.max_backoff, self.initial_backoff * self.multiplier**attempt)
        except OverflowError:  # a float power past ~1e308: long past the cap anyway
            full = self.max_backoff
        return float(full * (1 - self.jitter * rand))
