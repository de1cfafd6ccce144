"""The live view of a run in the terminal: steps as they are recorded, model text as it
streams, tool calls, tokens and cost, and a spinner while nothing happens.

On a terminal it uses a rich ``Live`` region for the streaming text and the spinner;
elsewhere (a pipe, a CI log) it prints one line per step and nothing transient.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.text import Text

from toren.cli.backend import LocalRun
from toren.client import Run
from toren.core.contract.values import RunStatus, from_nano, retry_limits

RESULT_WIDTH = 160


def short(value: object, width: int = RESULT_WIDTH) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def money(value: object) -> str:
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        return f"${value}"
    return f"${amount:.6f}"


def _step(event: Mapping[str, Any]) -> str:
    stream = event.get("stream") or "main"
    pos = event.get("position")
    return f"{stream}/{pos}" if pos is not None else stream


class RunView:
    """Renders the items of :meth:`toren.cli.backend.Backend.follow`."""

    def __init__(
        self, console: Console, *, show_input: bool = True, replayed_upto: int = 0
    ) -> None:
        self.console = console
        # Events up to this seq were in the log before this view began: their steps are
        # replayed from it, not run (and not paid) again.
        self.replayed_upto = replayed_upto
        self.replayed = 0
        self.tty = console.is_terminal
        self.show_input = show_input
        self.streaming: dict[str, str] = {}  # "stream/pos" -> text so far
        self.status = "starting"
        self.activity = "waiting for the model"  # what the run does after the last event
        self.since = time.monotonic()  # when the last event arrived
        self._live: Live | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> RunView:
        if self.tty:
            self._live = Live(
                self._region(), console=self.console, transient=True, refresh_per_second=12
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _region(self) -> RenderableType:
        parts: list[RenderableType] = []
        for key, text in self.streaming.items():
            parts.append(Text.assemble(("  " + key + "  ", "dim"), (text, "")))
        elapsed = time.monotonic() - self.since
        parts.append(Spinner("dots", text=Text(f"{self.status}  {elapsed:.1f}s", style="dim")))
        return Group(*parts)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._region())

    def print(self, markup: str) -> None:
        self.console.print(markup, highlight=False)

    # -- items ----------------------------------------------------------------------------

    def handle(self, kind: str, data: Mapping[str, object] | Run) -> None:
        if isinstance(data, Run):  # "idle" or "end"
            self.status = _status_line(data, self.activity)
        elif kind == "delta":
            key = f"{data.get('stream') or 'main'}/{data.get('position')}"
            self.streaming[key] = self.streaming.get(key, "") + str(data.get("text", ""))
            self.status = "the model is writing"
        elif kind == "event":
            self.event(data)
            self.since = time.monotonic()
        self._refresh()

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        p: Mapping[str, object] = event.get("payload") or {}
        render = getattr(self, f"_on_{kind}", None)
        if render is not None:
            render(event, p)
        self.activity = _activity(event, p, self.activity)
        self.status = self.activity

    def _on_RunStarted(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        run_id, agent = escape(str(event.get("run_id", ""))), escape(str(p.get("agent")))
        line = f"[bold]▶ run[/] {run_id}  agent [cyan]{agent}[/]"
        if p.get("process", "main") != "main":
            line += f" process [cyan]{escape(str(p.get('process')))}[/]"
        if self.show_input and p.get("input") is not None:
            line += f"  input {escape(short(p.get('input'), 80))}"
        self.print(line)

    def _on_ModelCallRecorded(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        key = _step(event)
        self.streaming.pop(key, None)
        ref = f"{p.get('provider')}:{p.get('model')}"
        head = (
            f"[bold magenta]◆ model[/] {escape(ref)} [dim]{escape(key)}[/]  "
            f"{p.get('input_tokens', 0)} in / {p.get('output_tokens', 0)} out tok  "
            f"{money(p.get('cost_usd', '0'))}  [dim]{float(p.get('latency_ms') or 0):.0f} ms[/]"
        )
        self.print(head + self._replayed(event))
        if p.get("error"):
            err = p["error"]
            self.print(f"  [red]✗ {escape(str(err.get('message', err)))}[/]")
            return
        response = p.get("response") or {}
        text = str(response.get("text") or "")
        if text:
            self.print("  " + escape(short(text, 2000)))
        for call in response.get("tool_calls") or ():
            name = escape(str(call.get("name")))
            if call.get("arguments_error"):  # garbled by the model: answered, not run
                raw = escape(short(str(call.get("raw_arguments") or ""), 120))
                self.print(f"  [dim]→ asks for[/] {name}({raw}) [yellow]arguments not valid[/]")
                continue
            args = short(call.get("arguments") or {}, 120)
            self.print(f"  [dim]→ asks for[/] {name}({escape(args)})")

    def _on_ModelCallCutOff(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        key = f"{p.get('stream') or 'main'}/{p.get('position')}"
        self.streaming.pop(key, None)
        self.print(
            f"[yellow]✂ model call cut off[/] [dim]{escape(key)}[/] "
            f"({escape(str(p.get('reason') or 'cancelled'))}): "
            f"{p.get('input_tokens', 0)} in / {p.get('output_tokens', 0)} out tok  "
            f"{money(p.get('cost_usd', '0'))} counted; the step runs again"
        )

    def _replayed(self, event: Mapping[str, Any]) -> str:
        """The mark of a step recorded before this view began (replayed, free)."""
        if event.get("position") is None or int(event.get("seq") or 0) > self.replayed_upto:
            return ""
        self.replayed += 1
        return "  [dim cyan]↺ replayed[/]"

    def _on_ToolCallRecorded(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        name = escape(str(p.get("name")))
        args = escape(short(p.get("args") or {}, 100))
        reused = "  [yellow](reused, not re-executed)[/]" if p.get("reused_from_seq") else ""
        self.print(
            f"[bold blue]⚙ tool[/] {name}({args}) [dim]{escape(_step(event))}[/]  "
            f"[dim]{float(p.get('latency_ms') or 0):.0f} ms[/]{reused}{self._replayed(event)}"
        )
        if p.get("error"):
            self.print(f"  [red]✗ {escape(str((p['error'] or {}).get('message')))}[/]")
        else:
            self.print(f"  [dim]=[/] {escape(short(p.get('result')))}")

    def _on_StreamInvalidated(self, event: Mapping[str, Any], p: Mapping[str, Any]) -> None:
        self.print(
            f"[bold yellow]⚠ invalidated[/] stream {escape(event.get('stream') or 'main')} from "
            f"step {p.get('from_pos')} ({escape(str(p.get('cause')))}; code version "
            f"{escape(str(p.get('code_version')))}): the steps before it are replayed, "
            "the rest run again"
        )

    def _on_MessageReceived(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        self.print(
            f"[bold green]✉ message[/] {escape(repr(p.get('name')))}: "
            f"{escape(short(p.get('payload')))}"
        )

    def _on_TimerScheduled(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        if p.get("purpose") == "sleep":
            self.print(f"[dim]⏲ sleeping {float(p.get('seconds') or 0):g}s[/]")

    def _on_ChildStarted(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        self.print(
            f"[bold]↳ spawned[/] {escape(str(p.get('process')))} as stream "
            f"{escape(str(p.get('child_stream')))}"
        )

    def _on_ChildCompleted(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        what = "failed" if p.get("error") else "finished"
        self.print(f"[bold]↲ child {what}[/] [dim]{escape(_step(event))}[/]")

    def _on_RunWaiting(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        if p.get("messages"):
            names = ", ".join(repr(m) for m in p["messages"])
            self.print(f"[bold cyan]… waiting[/] for message {escape(names)}")

    def _on_RunCompleted(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        output = p.get("output")
        answer = output.get("answer") if isinstance(output, Mapping) else None
        shown = answer if isinstance(answer, str) else output
        self.print(f"[bold green]✔ completed[/]  {escape(short(shown, 2000))}")

    def _on_RunFailed(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        error = p.get("error") or {}
        self.print(
            f"[bold red]✘ failed[/]  {escape(str(error.get('type', 'Error')))}: "
            f"{escape(str(error.get('message', '')))}"
        )
        where = _raised_at(str(error.get("traceback") or ""))
        if where:  # the whole (agent-only) traceback is in `toren runs show`
            run_id = event.get("run_id", "")
            self.print(
                f"  [dim]raised at {escape(where)}; the traceback: toren runs show "
                f"{escape(str(run_id))}[/]"
            )

    def _on_RunCancelled(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        self.print(f"[bold yellow]■ cancelled[/]  {escape(str(p.get('reason') or ''))}")

    def _on_RunRetried(self, event: Mapping[str, object], p: Mapping[str, Any]) -> None:
        retried = len(p.get("retried_seqs") or ())
        what = f"{retried} failed step{'s' if retried != 1 else ''} run again" if retried else ""
        limits = retry_limits(p.get("raise_limits") or {})
        cost = limits.pop("max_cost_nanousd", None)
        shown = [f"{k}={v}" for k, v in limits.items()]
        shown += [f"max_cost_usd={from_nano(cost)}"] if cost is not None else []
        raised = ", ".join(shown)
        detail = "; ".join(x for x in (what, f"limits raised: {raised}" if raised else "") if x)
        self.print(
            f"[bold cyan]↻ retry {p.get('attempt', 1)}[/] under code version "
            f"{escape(str(p.get('code_version') or '?'))}: the recorded steps replay"
            + (f" ({escape(detail)})" if detail else "")
        )

    def _on_RunForked(self, event: Mapping[str, object], p: Mapping[str, object]) -> None:
        self.print(
            f"[bold cyan]⑂ forked[/] from run {escape(str(p.get('source_run')))} at "
            f"{escape(str(p.get('stream')))}:{p.get('position')}: the steps before it replay"
        )

    # -- the end --------------------------------------------------------------------------

    def summary(self, run: Run) -> None:
        usage = run.usage
        parts = [
            f"{usage.steps} steps",
            f"{usage.input_tokens} in / {usage.output_tokens} out tokens",
            f"{money(usage.cost_usd)} (estimated)",
        ]
        if self.replayed:
            parts.append(f"{self.replayed} replayed from the log")
        if usage.saved_by_replay_usd > 0:
            parts.append(f"{money(usage.saved_by_replay_usd)} saved by replay")
        if run.invalidations:
            parts.append(f"{run.invalidations} invalidation(s)")
        self.print(
            f"[dim]run {escape(run.id)} {escape(run.status)} · " + escape(" · ".join(parts)) + "[/]"
        )


def _activity(event: Mapping[str, object], p: Mapping[str, Any], current: str) -> str:
    kind = event.get("type")
    if kind == "ModelCallRecorded":
        calls = (p.get("response") or {}).get("tool_calls")
        return "running tools" if calls else "working"
    if kind in ("ToolCallRecorded", "RunStarted", "MessageReceived", "TimerFired"):
        return "waiting for the model"
    return current


def _status_line(run: Run, activity: str = "working") -> str:
    status = run.status
    # Only the embedded database knows the lease's holder (a LocalRun): a server's run
    # is never "leased here" nor "held by another worker" in this view.
    local = run if isinstance(run, LocalRun) else None
    leased = local is not None and local.lease_owner and not local.foreign_lease
    if status == RunStatus.QUEUED and not leased and not run.usage.steps:
        return "queued: waiting for a worker"
    if status == RunStatus.WAITING:
        nb = run.not_before
        if nb and not run.waiting_for:
            return f"sleeping ({max(0.0, float(nb) - time.time()):.0f}s left)"
        return f"waiting for message {', '.join(map(repr, run.waiting_for or []))}"
    if status in (RunStatus.RUNNING, RunStatus.QUEUED):
        blocked = run.blocked
        if blocked:
            message = (blocked.get("error") or {}).get("message")
            return (
                f"blocked: {message} (attempt {blocked.get('attempts')}, next try "
                f"{next_try(blocked.get('retry_at'))})"
            )
        owner, expires = (local.lease_owner, local.lease_expires_at) if local else (None, None)
        if local and local.foreign_lease and owner and expires and expires > time.time():
            left = expires - time.time()
            return (
                f"held by worker {owner} until {_clock(expires)}: waiting for its lease "
                f"({left:.0f}s)"
            )
        return activity
    return str(status)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')


def _raised_at(traceback: str) -> str:
    """``file:line in function`` of the innermost frame of a stored traceback, or ''."""
    found = [m for line in traceback.splitlines() if (m := _FRAME.match(line))]
    if not found:
        return ""
    path, line, fn = found[-1].groups()
    return f"{path}:{line} in {fn}"


def _clock(ts: Any) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OSError):
        return "-"


def next_try(retry_at: object) -> str:
    """When a blocked run is tried again: its time, and once that has passed, by whom
    (only a worker retries it: nothing happens at that time without one)."""
    due = isinstance(retry_at, int | float) and retry_at <= time.time()
    when = _clock(retry_at)
    return f"{when} (due: a 'toren worker' or 'toren dev' takes it)" if due else when
