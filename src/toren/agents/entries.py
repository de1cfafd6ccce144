"""What an ``entry:`` of agent.yaml may name, and the hook that widens it.

``entry: module:attr`` names an async function written against the context API
(``async def main(ctx, input)``) or, through an :class:`EntryAdapter`, a framework's
agent object (a ``pydantic_ai.Agent``, an OpenAI Agents SDK ``Agent``). The adapters live
in ``toren.integrations``, a layer above this package, so the loader cannot import them:
the composition root (``toren.runtime``) injects them as one callable.

An adapter recognises its objects by type and turns one into an ordinary agent function
``async (ctx, input) -> output`` whose model calls are ``ctx.model`` steps and whose tool
calls are ``ctx.tool`` steps. It answers ``None`` for an object it does not know, and
raises :class:`EntryRefused` for one it knows but cannot run (a feature it does not
support): the loader reports that as a problem of agent.yaml, so the agent fails to load
and no run is ever created for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from toren.core.agent_api.program import AgentFn, ToolDef
from toren.core.contract.ports import ModelProvider

__all__ = ["EntryAdapter", "EntryRefused", "entry_providers", "entry_tools"]


class EntryRefused(Exception):
    """An entry object an adapter recognised but cannot run. ``found`` says what is
    wrong with it and ``expected`` what to do instead; the loader quotes both."""

    def __init__(self, found: str, expected: str) -> None:
        super().__init__(f"found {found}; expected {expected}")
        self.found = found
        self.expected = expected


class EntryAdapter(Protocol):
    """``adapt_entry(obj, *, where)``: the agent function for ``obj``, or ``None`` when
    ``obj`` is of no framework this adapter knows. ``where`` names the entry for messages
    (``"/srv/agents/support/agent.yaml: entry 'app:agent'"``)."""

    def __call__(self, obj: object, *, where: str) -> AgentFn | None: ...


class InstallHint(Protocol):
    """Optionally also offered by an :class:`EntryAdapter`: for a module an entry's
    import could not find (``"pydantic_ai"``), what to install (``"toren-run[pydantic-ai]"``)."""

    def install_hint(self, module: str) -> str | None: ...


def entry_providers(fn: AgentFn) -> Mapping[str, ModelProvider]:
    """The providers an adapted entry brings (``fn.toren_providers``): a framework agent
    sends its requests with its own model objects, so the adapter hands the engine a
    provider per provider name its requests carry. Empty for a plain agent function."""
    providers = getattr(fn, "toren_providers", None)
    return providers if isinstance(providers, Mapping) else {}


def entry_tools(fn: AgentFn) -> Mapping[str, ToolDef] | None:
    """The tools an adapted entry brings (``fn.toren_tools``): what the engine's tool
    steps run and how they treat side effects (the framework's tools, called through
    ``ctx.tool``). ``None`` for a plain agent function."""
    tools = getattr(fn, "toren_tools", None)
    return tools if isinstance(tools, Mapping) else None
