"""Keep secrets out of responses. Provider SDK errors can quote a key, and an agent may put
anything in its output; every run, event and error body the API returns passes through a
:class:`Redactor` first (and the clients pass every error they raise through one too).

The providers scrub their own key out of an SDK's error with the same :class:`Redactor`.
This module imports nothing of the web stack, so :mod:`toren.client` can use it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
# Shapes of well-known provider credentials (OpenAI and Anthropic keys, AWS access keys).
_KEY_SHAPES = re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}|\bAKIA[0-9A-Z]{16}\b")
_SECRET_NAMES = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_SECRET_KEY|_PASSWORD)$")
_MIN_SECRET = 8  # shorter values would redact ordinary words
_SHORTEST_KEY = len("sk-") + 16  # the shortest string _KEY_SHAPES matches
_LOOSE = r"sk-[A-Za-z0-9_\-]{16,}|AKIA[0-9A-Z]{16}"  # _KEY_SHAPES without \b
_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f\u2028\u2029]')

# Objects and arrays nested deeper than this (counted from the value redacted) come back
# as TOO_DEEP. Responses wrap a value in a few more levels, and pydantic's serializer
# refuses past ~254, so without the bound one stored deep value (an agent's output, say)
# would fail every list and get that includes it. Request values are limited to
# toren.core.contract.inputs.MAX_JSON_DEPTH (64), well below: what a client sent comes back whole.
MAX_DEPTH = 128
TOO_DEEP = f"[nested deeper than {MAX_DEPTH} levels]"


def secrets_from_env(env: Mapping[str, str]) -> list[str]:
    """Values of variables named like credentials (``OPENAI_API_KEY``, ``TOREN_API_TOKEN``):
    each value whole, and each comma-separated part of it on its own (``TOREN_API_TOKEN=A,B``
    is two tokens in rotation, and a request carries only one)."""
    found: list[str] = []
    for name, value in env.items():
        if value and _SECRET_NAMES.search(name.upper()):
            found.append(value)
            if "," in value:
                found += [part.strip() for part in value.split(",") if part.strip()]
    return found


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is removed whole.
        self.secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)
        # One pass over a string for every secret and key shape (a list page redacts
        # thousands of strings), and none at all for strings too short to hold any.
        alternatives = [re.escape(s) for s in self.secrets] + [_KEY_SHAPES.pattern]
        self._pattern = re.compile("|".join(alternatives))
        self._shortest = min([_SHORTEST_KEY, *map(len, self.secrets)])
        # A superset of what ``_pattern`` finds (no word boundaries: in JSON text an
        # escaped character stands before a key where a boundary was), searched in a
        # value's JSON text to skip copying values with nothing to redact. Only when no
        # secret holds a character JSON escapes (it would not be found as written).
        self._anywhere = re.compile("|".join([*(re.escape(s) for s in self.secrets), _LOOSE]))
        self._json_safe = not any(_JSON_ESCAPED.search(s) for s in self.secrets)

    def text(self, value: str) -> str:
        if len(value) < self._shortest:
            return value
        return self._pattern.sub(REDACTED, value)

    def __call__(self, value: object) -> object:
        """A redacted copy of a JSON value (the value itself when it has nothing to
        redact and is not too deep). Iterative, not recursive: no depth of nesting can
        make it raise ``RecursionError``."""
        if self._json_safe and self._clean(value):
            return value
        root = [value]
        # Containers still to copy: (the container that holds it, its slot there, depth).
        work: list[tuple[Any, Any, int]] = [(root, 0, 0)]
        while work:
            parent, slot, depth = work.pop()
            item = parent[slot]
            if isinstance(item, str):
                parent[slot] = self.text(item)
            elif isinstance(item, dict | list):
                if depth >= MAX_DEPTH:
                    parent[slot] = TOO_DEEP
                    continue
                copy = self._copy(item)
                parent[slot] = copy
                work.extend((copy, k, depth + 1) for k in self._nested(copy))
        return root[0]

    def passes_json_text(self, text: str) -> bool:
        """Nothing to redact in the JSON text ``text`` (a response already serialised):
        no secret or key shape in it, found as written. False also when a secret holds
        a character JSON escapes (it could hide in the text), so the caller redacts the
        values instead. Depth is the caller's to check."""
        if not self._json_safe or any(secret in text for secret in self.secrets):
            return False
        # Substring tests are much faster than the regex; it runs only where a key shape
        # may start.
        return ("sk-" not in text and "AKIA" not in text) or self._anywhere.search(text) is None

    def _clean(self, value: object) -> bool:
        """Nothing in ``value`` to redact or cut, judged on its JSON text in one C-speed
        pass: most values (a page of runs) need no copy at all."""
        try:
            text = json.dumps(value, ensure_ascii=False, check_circular=False)
        except (TypeError, ValueError, RecursionError):
            return False
        # Depth is at most the number of brackets: few brackets, no value too deep.
        shallow = text.count("[") + text.count("{") <= MAX_DEPTH
        return shallow and self._anywhere.search(text) is None

    def _copy(
        self, item: dict[object, object] | list[object]
    ) -> dict[object, object] | list[object]:
        """A shallow copy with its strings (keys included) redacted."""
        if isinstance(item, dict):
            return {self._scalar(k): self._scalar(v) for k, v in item.items()}
        return [self._scalar(v) for v in item]

    def _scalar(self, value: object) -> object:
        return self.text(value) if isinstance(value, str) else value

    @staticmethod
    def _nested(copy: dict[object, object] | list[object]) -> list[object]:
        """The slots of ``copy`` that hold containers, still to be copied."""
        slots = copy.items() if isinstance(copy, dict) else enumerate(copy)
        return [k for k, v in slots if isinstance(v, dict | list)]


# A key shape that may still be growing at the end of a text, or a prefix of one.
_KEY_PARTIAL = re.compile(r"\b(?:sk-[A-Za-z0-9_\-]*|sk?|AKIA[0-9A-Z]{0,16}|A(?:K(?:I)?)?)$")
_KEY_CHAR = re.compile(r"^[A-Za-z0-9_\-]*")
_KEY_MIN = len("sk-") + 16  # from this length on a growing ``sk-`` run is a key, whatever follows


class StreamRedactor:
    """Redacts a text that arrives in pieces (a model's token deltas), so that a secret
    split across pieces never gets out either.

    :meth:`feed` returns what can be sent now. It holds back the end of the text while
    that end could be the start of a secret (the longest such suffix is shorter than the
    longest secret) or of a key shape still growing; :meth:`flush` gives the rest. What
    comes out, joined, equals ``redactor.text`` of the whole text, or redacts more (a key
    shape is judged without the characters already sent)."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.pending = ""
        self._in_key = False  # inside a key shape already sent as REDACTED

    def feed(self, piece: str) -> str:
        text = self.pending + piece
        if self._in_key:
            rest = text[len(_KEY_CHAR.match(text).group(0)) :]  # type: ignore[union-attr]
            if not rest:
                self.pending = ""
                return ""
            self._in_key, text = False, rest
        cut = self._safe_end(text)
        partial = _KEY_PARTIAL.search(text)
        if partial is not None and partial.start() < cut:
            if partial.group(0).startswith("sk-") and len(partial.group(0)) >= _KEY_MIN:
                # A key for sure; its end is still coming. Send the marker now and swallow
                # the rest of it as it arrives, so nothing unbounded is held.
                self.pending, self._in_key = "", True
                return self.redactor.text(text[: partial.start()]) + REDACTED
            cut = partial.start()
        cut = self._not_inside_a_secret(text, cut)
        self.pending = text[cut:]
        return self.redactor.text(text[:cut])

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return "" if self._in_key and not text else self.redactor.text(text)

    def _safe_end(self, text: str) -> int:
        """Where the longest suffix of ``text`` that starts some secret begins.

        Only the places in the last ``len(secret) - 1`` characters that hold the secret's
        first character can start such a suffix: found with ``str.find``, each checked
        once (a list page runs this over 50 previews per request)."""
        end = len(text)
        cut = end
        for secret in self.redactor.secrets:
            first = secret[0]
            at = text.find(first, max(0, end - len(secret) + 1), cut)
            while at != -1:
                if text.startswith(secret[: end - at], at):
                    cut = at
                    break
                at = text.find(first, at + 1, cut)
        return cut

    def _not_inside_a_secret(self, text: str, cut: int) -> int:
        """Move ``cut`` back to the start of any whole secret it would split."""
        moved = True
        while moved:
            moved = False
            for secret in self.redactor.secrets:
                start = text.find(secret, max(0, cut - len(secret) + 1))
                if 0 <= start < cut:
                    cut, moved = start, True
        return cut


def redact_prefix(redactor: Redactor, text: str) -> str:
    """``text``, the start of a longer text cut at an arbitrary point (a list's preview),
    redacted as if whole: secrets in it are replaced, and an end that could be the start
    of a secret or of a key shape is left out, so that no cut shows part of one."""
    return StreamRedactor(redactor).feed(text)
