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
The response depends only on the request, so replays and re-runs agree. Every call
actually served is appended to the *ledger* (a JSON-lines file), which is how tests count
what was paid for, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from toren.errors import AgentConfigError, ModelCallFailed
from toren.providers.base import DeltaCallback, ModelRequest, ModelResponse, ToolCall, Usage


class ScriptedProvider:
    name = "scripted"

    def __init__(
        self,
        script: str | Path | Mapping[str, Any] | None = None,
        *,
        base_dir: str | Path | None = None,
        ledger_path: str | Path | None = None,
    ) -> None:
        self._fixed = _load(script) if script is not None else None
        self._base = Path(base_dir) if base_dir is not None else Path.cwd()
        self._scripts: dict[str, dict[str, Any]] = {}
        ledger = ledger_path or os.environ.get("TOREN_SCRIPTED_LEDGER")
        self.ledger_path = Path(ledger) if ledger else None
        self.served = 0

    def script_for(self, model: str) -> dict[str, Any]:
        if self._fixed is not None:
            return self._fixed
        if model not in self._scripts:
            if model == "echo":
                self._scripts[model] = {"default": {"text": "{last_user}"}}
            else:
                self._scripts[model] = _load(self._base / model)
        return self._scripts[model]

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        script = self.script_for(request.model)
        reply = _choose(script, request)
        if "error" in reply:
            raise ModelCallFailed(str(reply["error"]), status=int(reply.get("status", 500)))
        latency = float(reply.get("latency", script.get("latency", 0.0)))
        if latency:
            await asyncio.sleep(latency)
        fields = _fields(request)
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

    def _record(self, request: ModelRequest, fields: Mapping[str, Any]) -> None:
        self.served += 1
        if self.ledger_path is None:
            return
        line = json.dumps(
            {"model": request.model, "turn": fields["turn"], "last_user": fields["last_user"]}
        )
        # One O_APPEND write per call: a line survives the process being killed after it.
        with open(self.ledger_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The calls a scripted provider served, in order (see ``ledger_path``)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text("utf-8").splitlines() if line.strip()]


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _fields(request: ModelRequest) -> dict[str, Any]:
    last_user = next(
        (str(m.get("content", "")) for m in reversed(request.messages) if m.get("role") == "user"),
        "",
    )
    last_tool = next(
        (str(m.get("content", "")) for m in reversed(request.messages) if m.get("role") == "tool"),
        "",
    )
    turn = sum(1 for m in request.messages if m.get("role") == "assistant")
    return {"last_user": last_user, "last_tool": last_tool, "turn": turn, "model": request.model}


def _choose(script: Mapping[str, Any], request: ModelRequest) -> Mapping[str, Any]:
    fields = _fields(request)
    for rule in script.get("rules") or ():
        when = rule.get("when") or {}
        needle = when.get("last_user_contains")
        if needle is not None and str(needle) in fields["last_user"]:
            return dict(rule.get("reply") or {})
    responses = script.get("responses") or []
    if fields["turn"] < len(responses):
        return dict(responses[fields["turn"]] or {})
    return dict(script.get("default") or {"text": "done"})


def _load(script: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(script, Mapping):
        return dict(script)
    path = Path(script)
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except FileNotFoundError:
        raise AgentConfigError(
            f"scripted model script {str(path)!r} does not exist; create it or fix the "
            "model reference (model: scripted:<file relative to the agent directory>)"
        ) from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(
            f"scripted model script {str(path)!r} is not valid YAML: {exc}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AgentConfigError(
            f"scripted model script {str(path)!r} must be a mapping with responses/rules/"
            f"default, got {type(data).__name__}"
        )
    for key in data:
        if key not in ("responses", "rules", "default", "latency", "stream_chunk"):
            raise AgentConfigError(
                f"scripted model script {str(path)!r}: unknown key {key!r}; expected one of "
                "responses, rules, default, latency, stream_chunk"
            )
    return data
