"""Framework integrations: agents written with pydantic-ai or the OpenAI Agents SDK, run
as Toren agents.

A framework agent drives its own loop; Toren owns its calls. Each integration adapts the
framework's agent object into an ordinary agent function ``async (ctx, input) -> output``
whose model requests are model steps (digested from Toren's provider-neutral request,
never from the framework's serialisation) and whose tool calls are tool steps.

This package sits above ``toren.agents`` (which may not import it) and below the
surfaces. The composition root (``toren.runtime``) hands :data:`adapt_entry` to the agent
loader, which calls it for an ``entry:`` that names something other than an async
function. Each framework is one :class:`FrameworkAdapter` in :data:`ADAPTERS`: it
recognises its objects by type (without importing the framework for objects of other
frameworks) and imports its integration module only when it has one to adapt.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from toren.core.agent_api.program import AgentFn

__all__ = ["ADAPTERS", "FrameworkAdapter", "FrameworkAdapters", "adapt_entry"]


@dataclass(frozen=True)
class FrameworkAdapter:
    """One framework. ``package`` is the framework's top-level import name; ``module``
    the Toren integration module, which defines ``adapt(obj, *, where) -> AgentFn | None``
    (``None`` for an object of that framework it does not run, raising
    :class:`~toren.agents.entries.EntryRefused` for one it cannot run); ``extra`` what to
    install; ``kind`` how agent.yaml's errors name the objects it takes."""

    name: str
    package: str
    module: str
    extra: str
    kind: str

    def owns(self, obj: object) -> bool:
        """Whether ``obj`` is an instance of a class from this framework (any class of its
        MRO defined under ``package``): decided from module names, so an object of another
        framework never imports this one."""
        return any(
            (cls.__module__ or "").partition(".")[0] == self.package for cls in type(obj).__mro__
        )

    def adapt(self, obj: object, *, where: str) -> AgentFn | None:
        integration = importlib.import_module(self.module)
        return integration.adapt(obj, where=where)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FrameworkAdapters:
    """The injected ``adapt_entry`` hook over a tuple of adapters (see
    :mod:`toren.agents.entries`): the first adapter that owns the object adapts it."""

    adapters: tuple[FrameworkAdapter, ...]

    def __call__(self, obj: object, *, where: str) -> AgentFn | None:
        for adapter in self.adapters:
            if adapter.owns(obj):
                return adapter.adapt(obj, where=where)
        return None

    def install_hint(self, module: str) -> str | None:
        """What to install for a framework module an entry imports and that is missing."""
        for adapter in self.adapters:
            if adapter.package == module:
                return adapter.extra
        return None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(adapter.kind for adapter in self.adapters)


ADAPTERS: tuple[FrameworkAdapter, ...] = (
    FrameworkAdapter(
        name="pydantic-ai",
        package="pydantic_ai",
        module="toren.integrations.pydantic_ai",
        extra="toren-run[pydantic-ai]",
        kind="a pydantic_ai.Agent instance ('agent = Agent(...)')",
    ),
    FrameworkAdapter(
        name="openai-agents",
        package="agents",
        module="toren.integrations.openai_agents",
        extra="toren-run[openai-agents]",
        kind="an OpenAI Agents SDK agents.Agent instance ('agent = Agent(...)')",
    ),
)

adapt_entry = FrameworkAdapters(ADAPTERS)
