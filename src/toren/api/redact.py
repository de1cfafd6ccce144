"""Keep secrets out of responses. Provider SDK errors can quote a key, and an agent may put
anything in its output; every run and event the API returns passes through a
:class:`Redactor` first."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
# Shapes of well-known provider credentials (OpenAI and Anthropic keys, AWS access keys).
_KEY_SHAPES = re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}|\bAKIA[0-9A-Z]{16}\b")
_SECRET_NAMES = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_SECRET_KEY|_PASSWORD)$")
_MIN_SECRET = 8  # shorter values would redact ordinary words


def secrets_from_env(env: Mapping[str, str]) -> list[str]:
    """Values of variables named like credentials (``OPENAI_API_KEY``, ``TOREN_API_TOKEN``)."""
    return [v for k, v in env.items() if _SECRET_NAMES.search(k.upper()) and v]


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is removed whole.
        self.secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return _KEY_SHAPES.sub(REDACTED, value)

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        return value
