"""The step policies beside the journal: pure, decided once, asked by both drivers.

The journal (:mod:`toren.core.contract.journal`) decides what a step does from the log: replay,
run live, supersede, back off. What it needs to know of the agent's declarations to
decide is decided here, in one place, so the tick (:mod:`toren.core.drivers.steps`) and the dry
run of ``toren plan`` (:mod:`toren.core.drivers.plan`) cannot drift:

- :func:`tool_reusable`: may a live tool call take the result of a superseded identical
  call (the journal's ``reusable``)? Reuse guards side effects; a tool declared free of
  them, or ``reexecute: true``, runs again (fresh data).
- :func:`over_budget`: is the run's ``limits.max_cost_usd`` spent, so no further model
  call is made? Asked before a live model call; the plan never runs one live (it holds at
  the first step that would), so it has nothing to ask.
- The invalidation-storm back-off is the journal's own (``LiveVersions``), fed by the
  tick with the live workers' versions. The plan passes none on purpose: it answers what
  new code would do to a run, whichever workers are live at the time of the plan.

No I/O, no clock, no state: a function of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Protocol

from toren.core.contract.values import to_nano

__all__ = ["Budget", "ToolDeclaration", "over_budget", "tool_reusable"]


class ToolDeclaration(Protocol):
    """What the policy reads of a tool's declaration (``toren.core.agent_api.program.ToolDef``).
    A protocol, so the policy depends on no part above the journal."""

    @property
    def side_effects(self) -> bool: ...

    @property
    def reexecute(self) -> bool: ...


class Budget(Protocol):
    """What the policy reads of a run's limits (``toren.core.agent_api.program.Limits``)."""

    @property
    def max_cost_usd(self) -> Decimal | None: ...


def tool_reusable(tooldef: ToolDeclaration | None) -> bool:
    """Whether a live call of this tool may take the result recorded by a superseded,
    identical call (same name, same arguments) instead of running again. True for an
    undeclared tool (assumed to have side effects) and for one declared with side effects
    and without ``reexecute``; False otherwise."""
    return tooldef is None or (tooldef.side_effects and not tooldef.reexecute)


def over_budget(limits: Budget, spent_nanousd: Callable[[], int]) -> Decimal | None:
    """The budget (``limits.max_cost_usd``) when what the run has spent reaches it, so no
    further model call is made; None while it has not (or there is no budget).
    ``spent_nanousd`` is asked only when there is a budget: summing what a run spent is
    not free, and most runs set none (this is on the path of every live model call)."""
    limit = limits.max_cost_usd
    if limit is not None and spent_nanousd() >= to_nano(limit):
        return limit
    return None
