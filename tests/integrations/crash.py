"""SIGKILL at seeded-random points of a framework agent's run, for the pydantic-ai and
OpenAI Agents SDK crash tests.

A run is a sequence of *points*: each model call (its request on the wire with nothing
answered yet, or its answer half streamed) and each effect a tool, a handoff callback or
any other agent code is about to make. A seeded RNG picks several of them; a real
``toren worker`` process runs the agent, is stopped exactly at the first chosen point and
killed there with SIGKILL, a new worker is started, is killed at the next one, and so on;
the last worker finishes the run. Nothing waits a guessed time: the fake server holds a
chosen model call (:class:`~tests.providers.fakes.Hold`) and the agent's code holds
before a chosen effect, and the test kills the worker once the hold is reached, so each
kill lands where the plan says, on any machine.

The points cover every moment a kill can be told apart by what the outside world saw:
while a model call is in flight (before or during its answer), after a step was
recorded and before the next effect, and inside a tool before its effect. Not drawn: the
microseconds between a tool's effect and the commit of its record, the documented
at-least-once window of a step in flight (docs/storage.md); a tool that must never run
twice even there must be idempotent on its own key.

What the server served and what the effects did are counted by the test (the server's
request log, the agent's outbox file), never taken from Toren's own log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import toren
from tests.providers.fakes import Completion, FakeEndpoint, Hold, Reply
from toren.runtime import Runtime

# Appended to an agent's app.py: its effects go through ``_did`` (one outbox line each),
# and the crash test's hold file names the one effect to stop before, if any.
HOLD_CODE = """

# -- the crash test's holds (tests/integrations/crash.py) --------------------------------
import asyncio as _asyncio
import time as _time

_HOLD = Path({hold!r})
_REACHED = Path({reached!r})
_HOLD_BOUND = 6000  # x 0.01 s: the test kills the worker here; a bound, so it never hangs


def _point(tool, args):
    return f"{{tool}}:{{args['to']}}" if "to" in args else tool


def _held(point):
    if not _HOLD.exists() or _HOLD.read_text() != point:
        return False
    with _REACHED.open("a") as out:
        out.write(point + "\\n")
    return True


def _hold(point):
    if _held(point):
        for _ in range(_HOLD_BOUND):
            _time.sleep(0.01)


async def _ahold(point):
    if _held(point):
        for _ in range(_HOLD_BOUND):
            await _asyncio.sleep(0.01)


_effect = _did


def _did(tool, **args):
    _hold(_point(tool, args))  # a kill here: inside the tool, before its effect
    _effect(tool, **args)
"""


@dataclass(frozen=True)
class Point:
    """One place a worker can be killed. ``model``: the call whose request has ``key``
    (the test's turn key), held before its answer (``after=None``) or after ``after``
    events of its stream. ``effect``: the effect named ``key`` (``_point`` above)."""

    kind: str
    key: Hashable
    after: int | None = None

    def __str__(self) -> str:
        if self.kind == "effect":
            return f"effect {self.key}"
        where = "before" if self.after is None else f"after {self.after} events of"
        return f"model call {self.key}, held {where} its answer"


def kill_plan(points: Sequence[Point], kills: int, seed: int) -> list[Point]:
    """``kills`` of ``points`` (in run order), chosen by a seeded RNG, each model call
    held at a random place of its answer."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(points)), kills))
    plan = []
    for index in chosen:
        point = points[index]
        if point.kind == "model":
            point = dataclasses.replace(point, after=rng.choice([None, 1, 2]))
        plan.append(point)
    return plan


def worker(agents: Path, db_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env["TOREN_DATABASE_URL"] = db_url
    with log.open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from toren.cli.main import main; main()",
                "worker",
                "--agents",
                str(agents),
                "--worker-id",
                "crash-worker",  # the same id: a restart takes the lease back at once
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


class Crasher:
    """Runs one run of the agent in ``agents`` under a kill plan. ``answer`` is the fake
    model (a reply for each request, decided from the request alone, so a resumed run gets
    the same answers); ``turn`` the key of a request (which model call of the run it is)."""

    def __init__(
        self,
        tmp_path: Path,
        endpoint: FakeEndpoint,
        answer: Callable[[dict[str, Any]], Reply],
        turn: Callable[[dict[str, Any]], Hashable],
    ) -> None:
        self.endpoint, self.answer, self.turn = endpoint, answer, turn
        self.hold_file = tmp_path / "hold.txt"
        self.reached_file = tmp_path / "reached.txt"
        self.log = tmp_path / "workers.log"
        self.target: Point | None = None
        self.armed: Hold | None = None
        self.holds: list[Hold] = []
        self.kills: list[tuple[Point, int]] = []  # each kill, and requests served before it
        endpoint.responder = self.respond

    def hold_code(self) -> str:
        return HOLD_CODE.format(hold=str(self.hold_file), reached=str(self.reached_file))

    def respond(self, body: dict[str, Any]) -> Reply:
        """The fake model's answer; the planned call (its first request) is held."""
        reply = self.answer(body)
        target = self.target
        if target is None or target.kind != "model" or self.armed is not None:
            return reply
        if not isinstance(reply, Completion):  # an error answer is never held
            return reply
        if self.turn(body) != target.key:
            return reply
        after = target.after if body.get("stream") else None  # a JSON answer: before it
        self.armed = Hold(after=after)
        self.holds.append(self.armed)
        return dataclasses.replace(reply, hold=self.armed)

    def reached(self, point: Point) -> bool:
        if point.kind == "model":
            return self.armed is not None and self.armed.reached.is_set()
        lines = self.reached_file.read_text().splitlines() if self.reached_file.exists() else []
        return str(point.key) in lines

    async def run(self, runtime: Runtime, agents: Path, db_url: str, plan: Sequence[Point]) -> Any:
        """Start a run, kill a worker at each point of ``plan``, finish it on a last
        worker; the run as it ended."""
        run = await toren.start_run(runtime.store, runtime.resolver, "support", "Where is A-17?")
        try:
            for point in plan:
                self.target, self.armed = point, None
                self.hold_file.write_text(str(point.key) if point.kind == "effect" else "")
                proc = worker(agents, db_url, self.log)
                try:
                    await self._until(lambda p=point: self.reached(p), proc)
                finally:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                self.target = None
                self.hold_file.write_text("")
                self.kills.append((point, self.endpoint.served))
            proc = worker(agents, db_url, self.log)
            try:
                return await toren.wait_for_run(runtime.store, run.id, timeout=120)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        finally:
            for hold in self.holds:
                hold.release()

    async def _until(self, predicate: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 120  # a hang guard only: every wait has an end it awaits
        while not predicate():
            assert proc.poll() is None, f"the worker exited early: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the worker never reached {self.target}"
            await asyncio.sleep(0.01)

    def paid(self) -> Counter[Hashable]:
        """The model calls the server answered, by turn: every request but those held when
        their worker was killed (never answered, so never paid)."""
        held = Counter(point.key for point, _ in self.kills if point.kind == "model")
        served = Counter(self.turn(r.body) for r in self.endpoint.requests)
        return served - held

    def check_held_calls(self) -> None:
        """Each model kill landed on its call: the last request served before the kill is
        the held one, and its next request (the resume's) is the same request."""
        requests = self.endpoint.requests
        for point, served in self.kills:
            if point.kind == "model":
                assert self.turn(requests[served - 1].body) == point.key, point
                assert requests[served].body == requests[served - 1].body, point
