"""A second, independent implementation of the request digest, written from the text of
docs/digest.md alone, checked against every golden vector, against every digest of the
runs the scenario agents below record on SQLite and on PostgreSQL, and against the 0.1
event log: 100% verifiable, 0 mismatches.

This file must import nothing of ``toren.core.contract.digest`` or Toren's JSON helpers
(``toren.core.contract.jsontext``), and it reads the log with plain database drivers, parsing the
stored JSON with the standard library: if the spec leaves a rule out, this file cannot
know it (a test below checks the imports). Toren itself is used only to *record* runs.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import math
import shutil
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import toren
from toren.agents import DirectoryResolver
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

ROOT = Path(__file__).parents[2]
VECTORS = json.loads((ROOT / "tests/fixtures/v0_1/digest_vectors.json").read_text("utf-8"))
FIXTURES = ROOT / "tests" / "fixtures" / "v0_1"


class Refused(Exception):
    """A value with no canonical form (docs/digest.md §1)."""


# -- §2 canonical JSON --------------------------------------------------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def canon(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return canon_float(value)
    if isinstance(value, str):
        return canon_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canon(v) for v in value) + "]"
    if isinstance(value, Mapping):
        keys = sorted(value, key=lambda k: canon_string(k).encode("utf-8"))  # code points
        return "{" + ",".join(canon_string(k) + ":" + canon(value[k]) for k in keys) + "}"
    raise Refused(f"not a JSON value: {value!r}")


def utf16_repaired(s: str) -> str:
    """The spec's repair of a string that is not valid Unicode: read as UTF-16, a high
    surrogate followed by a low one is the character they encode, any other surrogate
    is U+FFFD."""
    out, i = [], 0
    while i < len(s):
        c = ord(s[i])
        nxt = ord(s[i + 1]) if i + 1 < len(s) else 0
        if 0xD800 <= c <= 0xDBFF and 0xDC00 <= nxt <= 0xDFFF:
            out.append(chr(0x10000 + ((c - 0xD800) << 10) + (nxt - 0xDC00)))
            i += 2
            continue
        out.append("\ufffd" if 0xD800 <= c <= 0xDFFF else s[i])
        i += 1
    return "".join(out)


def canon_string(s: str) -> str:
    out = []
    for ch in utf16_repaired(s):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def canon_float(x: float) -> str:
    if not math.isfinite(x):
        raise Refused("NaN or infinity")
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    if x < 0:
        return "-" + canon_float(-x)
    digits, e = shortest(x)
    if -4 <= e < 16:
        if e >= 0:
            whole = digits[: e + 1].ljust(e + 1, "0")
            return whole + "." + (digits[e + 1 :] or "0")
        return "0." + "0" * (-e - 1) + digits
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"


def shortest(x: float) -> tuple[str, int]:
    """The shortest digit string that rounds back to ``x`` (the nearest one when several
    of that length do) and the decimal exponent of its first digit."""
    exact = Decimal(x)
    for n in range(1, 18):
        mantissa, _, exp = f"{x:.{n - 1}e}".partition("e")
        m, k = int(mantissa.replace(".", "")), int(exp) - (n - 1)
        fits = [c for c in (m - 1, m, m + 1) if c > 0 and float(f"{c}e{k}") == x]
        if fits:
            best = min(fits, key=lambda c: abs(Decimal(f"{c}e{k}") - exact))
            text = str(best)
            return text.rstrip("0"), k + len(text) - 1
    raise AssertionError(f"no shortest form for {x!r}")


# -- §3 hashes and §4 step bodies ---------------------------------------------------------


def sha(prefix: str, value: Any) -> str:
    return hashlib.sha256(prefix.encode("ascii") + canon(value).encode("utf-8")).hexdigest()


def request_digest(kind: str, body: Any) -> str:
    return sha("toren.request.v1\n", {"kind": kind, "body": body})


def message_hash(message: Any) -> str:
    return sha("toren.message.v1\n", message)


def tool_spec(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool given as a mapping, with the defaults of §4."""
    return {
        "name": str(tool["name"]),
        "description": str(tool["description"]) if "description" in tool else "",
        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
    }


def tool_hash(spec: Any) -> str:
    return sha("toren.tool.v1\n", spec)


def list_node_hash(node: Any) -> str:
    return sha("toren.msglist.v1\n", node)


TRANSPORT = {
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


def model_body(inp: Mapping[str, Any]) -> dict[str, Any]:
    provider, model = inp["provider"], inp["model"]
    if "reference" in inp:
        provider, _, model = inp["reference"].partition(":")
        assert (provider, model) == (inp["provider"], inp["model"])
    return {
        "provider": provider,
        "model": model,
        "messages": [message_hash(m) for m in inp["messages"]],
        "tools": [tool_hash(tool_spec(t)) for t in inp["tools"]],
        "params": {k: v for k, v in inp["params"].items() if k not in TRANSPORT},
    }


# -- the golden vectors -------------------------------------------------------------------


def vector_digest(vector: Mapping[str, Any]) -> tuple[str, str]:
    """(canonical text, digest) of a vector of any section."""
    if "message" in vector:
        return canon(vector["message"]), message_hash(vector["message"])
    if "tool" in vector:
        spec = tool_spec(vector["tool"])
        return canon(spec), tool_hash(spec)
    inp = vector["input"]
    if inp["kind"] == "model":
        body = model_body(inp)
    else:
        body = inp["body"]
    return canon({"kind": inp["kind"], "body": body}), request_digest(inp["kind"], body)


ALL_REQUESTS = [*VECTORS["requests"], *VECTORS["rules"]]


@pytest.mark.parametrize("vector", ALL_REQUESTS, ids=lambda v: v["name"])
def test_every_golden_vector_by_the_spec(vector: dict[str, Any]) -> None:
    if vector.get("refused"):
        with pytest.raises(Refused):
            vector_digest(vector)
        return
    text, digest = vector_digest(vector)
    if "canonical" in vector:
        assert text == vector["canonical"]
    assert digest == vector["digest"]


def test_message_and_tool_vectors_of_0_1_by_the_spec() -> None:
    for vector in VECTORS["messages"]:
        assert message_hash(vector["input"]) == vector["hash"]
    for vector in VECTORS["tools"]:
        assert tool_hash(vector["input"]) == vector["hash"]


def test_floats_by_the_spec_match_the_examples_of_the_spec() -> None:
    doc = (ROOT / "docs" / "digest.md").read_text("utf-8")
    examples = {
        1.0: "1.0",
        0.1: "0.1",
        1e-4: "0.0001",
        1e15: "1000000000000000.0",
        float(2**53): "9007199254740992.0",
        1e16: "1e+16",
        1e-5: "1e-05",
        1e-7: "1e-07",
        2.5e-8: "2.5e-08",
        1.5e300: "1.5e+300",
        5e-324: "5e-324",
        123456789012345678901.0: "1.2345678901234568e+20",
        -0.0: "-0.0",
    }
    for value, text in examples.items():
        assert canon_float(value) == text
        assert f"`{text}`" in doc  # the example is in the spec's text


def test_this_file_imports_nothing_of_the_digest_or_json_code() -> None:
    tree = ast.parse(Path(__file__).read_text("utf-8"))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    forbidden = {
        "toren.core.contract.digest",
        "toren.core.contract.jsontext",
        "orjson",
        "toren.core.drivers.verify",
    }
    assert not imported & forbidden
    assert not any(str(m).startswith("toren.core.contract.recorded") for m in imported)


# -- §4/§5: reading a log and verifying it ------------------------------------------------


def read_sqlite(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    conn = sqlite3.connect(path)
    try:
        return _read(conn.execute)
    finally:
        conn.close()


def read_postgres(url: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return _read(conn.execute)


def _read(execute: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cols = ["seq", "run_id", "stream", "position", "generation", "type", "digest", "payload"]
    rows = execute(f"SELECT {', '.join(cols)} FROM events ORDER BY seq").fetchall()
    events = [dict(zip(cols, r, strict=True)) for r in rows]
    for e in events:
        e["payload"] = json.loads(e["payload"])
    blobs = {h: json.loads(b) for h, b in execute("SELECT hash, body FROM blobs").fetchall()}
    return events, blobs


def verify_log(events: Sequence[dict[str, Any]], blobs: Mapping[str, Any]) -> dict[str, list]:
    """§5: every step of every run: verified, unverifiable or mismatch."""
    verdicts: dict[str, list[Any]] = {"verified": [], "unverifiable": [], "mismatch": []}
    by_run: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_run.setdefault(e["run_id"], []).append(e)
    for run_events in by_run.values():
        waited = [
            n
            for e in run_events
            if e["type"] == "RunWaiting"
            for n in e["payload"].get("messages", [])
        ]
        steps: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        for e in run_events:
            if e["position"] is not None and e["type"] != "StreamInvalidated":
                key = (e["stream"], e["generation"], e["position"])
                steps.setdefault(key, []).append(e)
        for step in steps.values():
            verdict = verify_step(step, blobs, waited)
            verdicts[verdict].append((step[0]["run_id"], step[0]["seq"], step[0]["type"]))
    return verdicts


def verify_step(step: list[dict[str, Any]], blobs: Mapping[str, Any], waited: list[str]) -> str:
    first = step[0]
    if any(e["digest"] != first["digest"] for e in step):
        return "mismatch"
    try:
        candidates = bodies(step, blobs, waited)
    except KeyError:
        return "unverifiable"  # a blob the log references is missing
    if candidates is None:
        return "unverifiable"
    if candidates == "tampered":
        return "mismatch"
    kind, options = candidates
    if any(request_digest(kind, body) == first["digest"] for body in options):
        return "verified"
    return "unverifiable" if kind == "message" and not options else "mismatch"


def bodies(step: list[dict[str, Any]], blobs: Mapping[str, Any], waited: list[str]) -> Any:
    first, p = step[0], step[0]["payload"]
    t = first["type"]
    if t == "ModelCallRecorded":
        hashes: list[str] = []
        node = p["message_list"]
        while node is not None:
            body = blobs[node]
            if list_node_hash(body) != node:
                return "tampered"
            hashes[:0] = body["items"]
            node = body["prev"]
        if any(message_hash(blobs[h]) != h for h in hashes) or len(hashes) != p["message_count"]:
            return "tampered"
        if any(tool_hash(blobs[h]) != h for h in p["tools"]):
            return "tampered"
        body = {k: p[k] for k in ("provider", "model", "tools", "params")}
        return "model", [{**body, "messages": hashes}]
    if t == "ToolCallRecorded":
        return "tool", [{"name": p["name"], "args": p["args"]}]
    if t == "ValueRecorded":
        return "value", [{"what": p["what"]}]
    if t == "ChildStarted":
        return "child", [{"process": p["process"], "input": p["input"]}]
    if t == "MessageReceived":
        return "message", [{"name": p["name"], "timeout": None}]
    if t != "TimerScheduled":
        return None
    if "requested_seconds" in p:  # since 0.2
        given = [p["requested_seconds"]]
    else:  # 0.1: a float for a sleep; the integer is tried too (§4)
        s = p["seconds"]
        given = [s, int(s)] if isinstance(s, float) and s.is_integer() else [s]
    if p["purpose"] == "sleep":
        return "sleep", [{"seconds": s} for s in given]
    names = [p["message"]] if p.get("message") is not None else []
    if not names and len(step) > 1 and step[-1]["type"] == "MessageReceived":
        names = [step[-1]["payload"]["name"]]
    names = names or waited
    return "message", [{"name": n, "timeout": s} for n in names for s in given]


# -- the scenario agents, recorded on both backends ---------------------------------------

SYSTEM_V1 = "System \u2028 prompt 🚀 \x1f e\u0301"


def scenario(system: str, temperature: float) -> Any:
    async def main(ctx: toren.Context, input: Any) -> Any:
        messages: list[Any] = [
            {"role": "system", "content": system},
            {"role": "user", "content": "café \U0001f600 \ufeff/", "name": "ü"},
        ]
        first = await ctx.model(
            "scripted:echo",
            messages,
            temperature=temperature,
            top_p=1e-07,
            seed=2**70,
            bias=-0.0,
            big=1e16,
            stop=None,
            timeout=30,
            meta={"\U0001f600": 1, "\uffff": [1, 1.0, True], "": {}},
        )
        messages.append(first.message())
        tools = [
            {"name": "get_time"},
            ToolSpec("lookup", "Look up", {"type": "object", "properties": {"id": {}}}),
        ]
        await ctx.model("scripted:echo", [*messages, {"role": "user", "content": "t"}], tools=tools)
        await ctx.model("alias:echo", messages, max_tokens=5)  # a providers: alias
        await ctx.tool("note", {"text": "x\ny", "n": 1.0, "k": 2**64, "f": 0.30000000000000004})
        await ctx.now()
        await ctx.random()
        await ctx.uuid()
        await ctx.sleep(0)
        await ctx.sleep(0.0)
        await ctx.wait_for_message("pre", timeout=60)  # received, timed
        await ctx.wait_for_message("pre2")  # received, no timeout
        await ctx.wait_for_message("never", timeout=0)  # times out
        await ctx.wait_for_message("never", timeout=0.0)
        await ctx.spawn("child", {"q": 1.5, "e": "é"})
        await ctx.spawn("child")
        await ctx.wait_for_message("finish")  # parks: in flight for the next version
        return {"done": True}

    return main


async def child(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model("scripted:echo", [{"role": "user", "content": json.dumps(input)}])
    await ctx.tool("note", {"text": reply.text})
    return {"answer": reply.text}


def registry(version: str, system: str, temperature: float) -> toren.Registry:
    def note(text: str, **extra: Any) -> dict[str, Any]:
        return {"noted": text}

    tools = {"note": toren.ToolDef("note", note, ToolSpec("note"))}
    reg = toren.Registry()
    reg.add("scenario", scenario(system, temperature), tools=tools, code_version=version)
    reg.add("scenario", child, process="child", tools=tools, code_version=version)
    return reg


async def record_scenarios(store: Store, tmp_path: Path) -> list[str]:
    """Runs of every kind of step on ``store``, an invalidation included (a deploy edits
    the system prompt and the temperature while a run is in flight), plus the example
    agent's built-in loop (its tools come from tools.py)."""
    provider = ScriptedProvider()
    providers = {"scripted": provider, "alias": provider}
    v1 = registry("v1", SYSTEM_V1, 0.2)
    run = await toren.start_run(store, v1, "scenario", {"x": 1})
    now = time.time()
    await store.send_message(run.id, "pre", {"ok": 1}, now=now)
    await store.send_message(run.id, "pre2", [1.5], now=now)
    deps = toren.TickDeps(store=store, agents=v1, providers=providers)
    first = await toren.tick(run.id, deps)
    assert first.status == "waiting", first

    v2 = registry("v2", SYSTEM_V1 + " (edited)", 0.7)
    await store.send_message(run.id, "finish", None, now=time.time())
    second = await toren.tick(run.id, toren.TickDeps(store=store, agents=v2, providers=providers))
    assert second.status == "completed", second

    root = shutil.copytree(ROOT / "examples" / "support-agent", tmp_path / "a" / "support-agent")
    assert root.is_dir()
    with DirectoryResolver(tmp_path / "a") as resolver:
        loop_deps = toren.TickDeps(store=store, agents=resolver)
        loop_run = await toren.start_run(store, resolver, "support-agent", "Where is A-17?")
        done = await toren.tick(loop_run.id, loop_deps)
        assert done.status == "completed", done
    return [run.id, loop_run.id]


@pytest.fixture
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(tmp_path / "outbox.jsonl"))
    monkeypatch.setenv("TOREN_SCRIPTED_LEDGER", str(tmp_path / "ledger.jsonl"))
    yield


async def test_every_recorded_digest_re_derives_by_the_spec(
    store: Store, db_url: str, tmp_path: Path, outbox: None
) -> None:
    run_ids = await record_scenarios(store, tmp_path)
    if db_url.startswith("sqlite:"):
        events, blobs = read_sqlite(db_url.removeprefix("sqlite:///"))
    else:
        events, blobs = await asyncio.to_thread(read_postgres, db_url)
    verdicts = verify_log(events, blobs)
    assert verdicts["mismatch"] == [] and verdicts["unverifiable"] == []
    verified = verdicts["verified"]
    kinds = {t for _, _, t in verified}
    assert kinds == {
        "ModelCallRecorded",
        "ToolCallRecorded",
        "ValueRecorded",
        "TimerScheduled",
        "MessageReceived",
        "ChildStarted",
    }
    assert any(e["type"] == "StreamInvalidated" for e in events)  # superseded steps too
    timers = [e["payload"] for e in events if e["type"] == "TimerScheduled"]
    assert {type(t["requested_seconds"]) for t in timers} == {int, float}
    assert {t.get("message") for t in timers} >= {"pre", "never", None}
    # Toren's own verifier agrees, step for step.
    toren_verified = 0
    for run_id in run_ids:
        report = await toren.verify_run(store, run_id)
        assert report.count("mismatch") == report.count("unverifiable") == 0
        toren_verified += report.count("verified")
    assert toren_verified == len(verified) > 40


def test_the_0_1_log_verifies_by_the_spec() -> None:
    """The 0.1 event log, read with §4's rules for logs written before 0.2."""
    lines = (FIXTURES / "events.jsonl").read_text("utf-8").splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    blob_lines = (FIXTURES / "blobs.jsonl").read_text("utf-8").splitlines()
    blobs = {b["hash"]: json.loads(b["body"]) for b in map(json.loads, blob_lines) if b}
    verdicts = verify_log(events, blobs)
    assert verdicts["mismatch"] == [] and verdicts["unverifiable"] == []
    assert len(verdicts["verified"]) == 65
