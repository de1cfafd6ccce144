"""The ``scripted`` provider: an offline, deterministic model for the scaffold, tests and
benchmarks. No key, no network.

A script is YAML (or a dict)::

    responses:                 # turn i gets responses[i]; turn = assistant messages so far
      - tool_calls: [{name: lookup_order, arguments: {order_id: "A-17"}}]
      - text: "Your order: {last_tool}"
    rules:                     # checked first: the first rule whose `when` matches wins
      - when: {last_user_contains: "refund"}
        reply: {text: "Refunds take 5 days."}
    default: {text: "done"}    # past the end of `responses`
    latency: 0.0               # seconds per call (simulated)
    stream_chunk: 8            # characters per streamed delta

Placeholders in text: ``{last_user}``, ``{last_tool}``, ``{turn}``, ``{model}``.
The model ``echo`` (``scripted:echo``) needs no script: it replies with the last user
message. The name is reserved: ``scripted:echo`` never reads a file called ``echo``
(refer to such a file as ``scripted:./echo``).
The response depends only on the request, so replays and re-runs agree. Every call
actually served is appended to the *ledger* (a JSON-lines file), which is how tests count
what was paid for, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toren.errors import AgentConfigError, ModelCallFailed
from toren.providers.base import DeltaCallback, ModelRequest, ModelResponse, ToolCall, Usage

if TYPE_CHECKING:
    from toren._yamlcheck import Loc, Problem

# YAML and its diagnostics (toren._yamlcheck) are imported where used: yaml is not loaded
# until a script is.

# The built-in model: scripted:echo answers with the last user message, no script needed.
ECHO_MODEL = "echo"
ECHO_SCRIPT: Mapping[str, object] = {"default": {"text": "{last_user}"}}


class ScriptedProvider:
    name = "scripted"

    def __init__(
        self,
        script: str | Path | Mapping[str, object] | None = None,
        *,
        base_dir: str | Path | None = None,
        ledger_path: str | Path | None = None,
    ) -> None:
        self._fixed = _load(script) if script is not None else None
        self._base = Path(base_dir) if base_dir is not None else Path.cwd()
        self._scripts: dict[str, dict[str, object]] = {}
        ledger = ledger_path or os.environ.get("TOREN_SCRIPTED_LEDGER")
        self.ledger_path = Path(ledger) if ledger else None
        self.served = 0

    def script_for(self, model: str) -> dict[str, Any]:
        if self._fixed is not None:
            return self._fixed
        if model not in self._scripts:
            if model == ECHO_MODEL:
                self._scripts[model] = dict(ECHO_SCRIPT)
            else:
                self._scripts[model] = _load(self._base / model)
        return self._scripts[model]

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        script = self.script_for(request.model)
        fields = _fields(request)
        reply = _choose(script, fields)
        if "error" in reply:
            raise ModelCallFailed(str(reply["error"]), status=int(reply.get("status", 500)))
        latency = float(reply.get("latency", script.get("latency", 0.0)))
        if latency:
            await asyncio.sleep(latency)
        text = str(reply.get("text", "")).format_map(_Missing(fields))
        if "pad_to" in reply:
            text = text.ljust(int(reply["pad_to"]), ".")
        calls = tuple(
            ToolCall(
                id=str(c.get("id") or f"call_{fields['turn']}_{i}"),
                name=str(c["name"]),
                arguments=dict(c.get("arguments") or {}),
            )
            for i, c in enumerate(reply.get("tool_calls") or ())
        )
        if on_delta is not None and text:
            chunk = int(script.get("stream_chunk", 8))
            for i in range(0, len(text), chunk):
                on_delta(text[i : i + chunk])
                await asyncio.sleep(0)
        self._record(request, fields)
        usage = Usage(
            input_tokens=sum(len(str(m.get("content") or "")) for m in request.messages) // 4 + 1,
            output_tokens=len(text) // 4 + 1,
        )
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            finish_reason="tool_calls" if calls else "stop",
            model=request.model,
        )

    def _record(self, request: ModelRequest, fields: Mapping[str, object]) -> None:
        self.served += 1
        if self.ledger_path is None:
            return
        line = json.dumps(
            {"model": request.model, "turn": fields["turn"], "last_user": fields["last_user"]}
        )
        # One O_APPEND write per call: a line survives the process being killed after it.
        with open(self.ledger_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def read_ledger(path: str | Path) -> list[dict[str, object]]:
    """The calls a scripted provider served, in order (see ``ledger_path``)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text("utf-8").splitlines() if line.strip()]


class _Missing(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _fields(request: ModelRequest) -> dict[str, Any]:
    """What a script's replies may use of the request, in one pass over its messages."""
    last_user: str | None = None
    last_tool: str | None = None
    turn = 0
    for m in reversed(request.messages):
        role = m.get("role")
        if role == "assistant":
            turn += 1
        elif role == "user" and last_user is None:
            last_user = str(m.get("content", ""))
        elif role == "tool" and last_tool is None:
            last_tool = str(m.get("content", ""))
    return {
        "last_user": last_user or "",
        "last_tool": last_tool or "",
        "turn": turn,
        "model": request.model,
    }


def _choose(script: Mapping[str, Any], fields: Mapping[str, Any]) -> Mapping[str, Any]:
    for rule in script.get("rules") or ():
        when = rule.get("when") or {}
        needle = when.get("last_user_contains")
        if needle is not None and str(needle) in fields["last_user"]:
            return dict(rule.get("reply") or {})
    responses = script.get("responses") or []
    if fields["turn"] < len(responses):
        return dict(responses[fields["turn"]] or {})
    return dict(script.get("default") or {"text": "done"})


# The shape of a script, said in every error about one.
SCRIPT_SHAPE = (
    "a mapping with 'responses: [reply, ...]', 'rules: [{when: {last_user_contains: text}, "
    "reply: reply}, ...]', 'default: reply', 'latency: seconds', 'stream_chunk: characters', "
    'where a reply is a mapping such as {text: "hi", tool_calls: [{name: tool, arguments: {}}]}'
)
_SCRIPT_KEYS = ("responses", "rules", "default", "latency", "stream_chunk")
_REPLY_KEYS = ("text", "tool_calls", "error", "status", "latency", "pad_to")
_CALL_KEYS = ("id", "name", "arguments")
_SCALAR = (str, int, float)


def load_script(path: str | Path) -> dict[str, object]:
    """Read and check a script file. Agent loading calls it, so a broken script is an
    :class:`AgentConfigError` (file, line, key, what was found, the shape expected) before
    any run exists, not a failed run."""
    from toren._yamlcheck import parse_yaml

    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise AgentConfigError(
            f"scripted model script {str(path)!r} does not exist; create it or fix the "
            "model reference (model: scripted:<file relative to the agent directory>)",
            file=str(path),
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentConfigError(
            f"{path}: found an unreadable file ({exc}); expected a UTF-8 YAML script, "
            + SCRIPT_SHAPE,
            file=str(path),
        ) from None
    data, lines = parse_yaml(text, str(path), example="'default: {text: \"done\"}'")
    return check_script(data, str(path), lines)


def check_script(
    data: Any, where: str, lines: Mapping[Loc, int] | None = None
) -> dict[str, object]:
    """``data`` as a script, or an :class:`AgentConfigError` listing what is wrong."""
    from toren._yamlcheck import config_error

    data = {} if data is None else data
    problems = list(_script_problems(data))
    if problems:
        raise config_error(where, problems, lines or {})
    return dict(data)


def _problem(path: Loc, value: object, expected: str) -> Problem:
    from toren._yamlcheck import Problem, describe_found

    return Problem(path, describe_found(value), expected)


def _script_problems(data: object) -> Iterator[Problem]:
    if not isinstance(data, Mapping):
        yield _problem((), data, SCRIPT_SHAPE)
        return
    for key, value in data.items():
        if key not in _SCRIPT_KEYS:
            yield _problem((str(key),), value, f"one of the keys {', '.join(_SCRIPT_KEYS)}")
        elif key in ("responses", "rules") and value is not None:
            yield from _list_problems(key, value)
        elif key == "default" and value is not None:
            yield from _reply_problems(("default",), value)
        elif key == "latency":
            yield from _number_problems(("latency",), value, "a number of seconds >= 0")
        elif key == "stream_chunk" and not _is_int(value, minimum=1):
            yield _problem((key,), value, "an integer >= 1 (characters per streamed delta)")


def _list_problems(key: str, value: object) -> Iterator[Problem]:
    if not isinstance(value, list):
        example = "[{text: hi}, ...]" if key == "responses" else "[{when: ..., reply: ...}]"
        yield _problem((key,), value, f"a list such as {example}; the script is {SCRIPT_SHAPE}")
        return
    for index, item in enumerate(value):
        if key == "responses":
            if item is not None:
                yield from _reply_problems((key, index), item)
        else:
            yield from _rule_problems((key, index), item)


def _rule_problems(path: Loc, rule: object) -> Iterator[Problem]:
    expected = "a rule such as {when: {last_user_contains: refund}, reply: {text: ...}}"
    if not isinstance(rule, Mapping) or set(rule) - {"when", "reply"}:
        yield _problem(path, rule, expected)
        return
    when = rule.get("when")
    if when is not None and (
        not isinstance(when, Mapping)
        or set(when) - {"last_user_contains"}
        or not isinstance(when.get("last_user_contains", ""), _SCALAR)
    ):
        yield _problem((*path, "when"), when, "a mapping such as {last_user_contains: refund}")
    if rule.get("reply") is not None:
        yield from _reply_problems((*path, "reply"), rule["reply"])


def _reply_problems(path: Loc, reply: object) -> Iterator[Problem]:
    if not isinstance(reply, Mapping):
        yield _problem(path, reply, "a reply: a mapping with text and/or tool_calls")
        return
    for key, value in reply.items():
        here = (*path, str(key))
        if key not in _REPLY_KEYS:
            yield _problem(here, value, f"one of the reply keys {', '.join(_REPLY_KEYS)}")
        elif key in ("text", "error") and not isinstance(value, _SCALAR):
            yield _problem(here, value, "a string")
        elif key == "tool_calls" and value is not None:
            yield from _calls_problems(here, value)
        elif key == "latency":
            yield from _number_problems(here, value, "a number of seconds >= 0")
        elif key == "status" and not _is_int(value, minimum=100):
            yield _problem(here, value, "an HTTP status code such as 500")
        elif key == "pad_to" and not _is_int(value, minimum=0):
            yield _problem(here, value, "an integer >= 0 (characters)")


def _calls_problems(path: Loc, calls: object) -> Iterator[Problem]:
    expected = "a tool call such as {name: get_weather, arguments: {city: Paris}}"
    if not isinstance(calls, list):
        yield _problem(path, calls, f"a list of tool calls, each {expected}")
        return
    for index, call in enumerate(calls):
        if (
            not isinstance(call, Mapping)
            or set(call) - set(_CALL_KEYS)
            or not isinstance(call.get("name"), str)
            or not call["name"]
            or not isinstance(call.get("arguments") or {}, Mapping)
        ):
            yield _problem((*path, index), call, expected)


def _number_problems(path: Loc, value: object, expected: str) -> Iterator[Problem]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        yield _problem(path, value, expected)


def _is_int(value: object, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _load(script: str | Path | Mapping[str, object]) -> dict[str, object]:
    if isinstance(script, Mapping):
        return check_script(script, "scripted model script (a mapping)")
    return load_script(script)
