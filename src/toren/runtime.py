"""Assemble a runtime from configuration: the one place the CLI (and tests) turn an agents
root, a database URL and :class:`~toren.config.Settings` into :class:`~toren.TickDeps`.

The agents root is one agent directory (it holds ``agent.yaml``) or a directory whose
subdirectories are agent directories. Providers are bound per agent by the resolver: the
``scripted`` provider reads its script from the agent directory; ``openai`` and
``anthropic`` are built from the agent's ``providers:`` settings and the environment on
their first call, so an agent that never calls them never needs their keys.

The code version is ``Settings.code_version`` (``TOREN_CODE_VERSION`` / ``--code-version``)
when set, else each agent directory's content hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from toren.agents import DirectoryResolver
from toren.agents.pricing import PriceTable, default_table
from toren.config import Settings
from toren.core.agent_api.program import Pricing
from toren.core.drivers.live import LiveHub
from toren.core.drivers.tick import TickDeps
from toren.integrations import adapt_entry
from toren.providers.base import (
    DeltaCallback,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Usage,
)
from toren.providers.registry import build_provider
from toren.providers.scripted import ScriptedProvider
from toren.store import Store, connect

__all__ = ["Runtime", "build_deps", "close_runtime", "open_runtime", "sqlite_url_for"]

STATE_DIR = ".toren"


def sqlite_url_for(project: str | Path, *, create: bool = True) -> str:
    """The embedded database of a project: ``<project>/.toren/toren.db`` (its directory
    created unless ``create`` is false: commands that only read must not leave one)."""
    state = Path(project).resolve() / STATE_DIR
    if create:
        state.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{state / 'toren.db'}"


class _LazyProvider:
    """A runtime-wide vendor provider (``openai``, ``anthropic``) built from the
    environment on its first call: a missing key or SDK is reported by the step that
    needs it (``ProviderUnavailable``), and an offline agent never needs one. An agent
    that configures ``providers:`` gets its own (see ``default_provider_factory``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._provider: ModelProvider | None = None

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        if self._provider is None:
            self._provider = build_provider(self.name)
        return await self._provider.complete(request, on_delta=on_delta)

    async def aclose(self) -> None:
        closer = getattr(self._provider, "aclose", None)
        if closer is not None:
            await closer()


def runtime_providers() -> dict[str, ModelProvider]:
    """The providers every agent may use by name. ``scripted`` reads scripts relative to
    the working directory (agents get their own, bound to their directory)."""
    return {
        "scripted": ScriptedProvider(),
        "openai": _LazyProvider("openai"),
        "openai-responses": _LazyProvider("openai-responses"),
        "anthropic": _LazyProvider("anthropic"),
    }


def make_pricing(table: PriceTable) -> Pricing:
    def price(model_ref: str, usage: Usage) -> Decimal:
        return table.cost(model_ref, usage)

    return price


@dataclass
class Runtime:
    """An opened runtime: the store, the resolver, the live hub and the deps of a tick."""

    root: Path
    store: Store
    resolver: DirectoryResolver
    deps: TickDeps
    live: LiveHub
    settings: Settings
    providers: dict[str, ModelProvider] = field(default_factory=runtime_providers)

    def reload_deps(self) -> TickDeps:
        """Fresh deps for the same store, resolver and hub. The
        resolver reloads an edited agent by itself (it checks the directory's content hash
        on every resolve), so its code version changes with its files. ``toren dev`` calls
        this on every change and starts a new worker with the result."""
        self.deps = build_deps(
            self.store, self.resolver, self.settings, live=self.live, providers=self.providers
        )
        return self.deps


def make_resolver(root: str | Path, settings: Settings) -> DirectoryResolver:
    return DirectoryResolver(root, code_version=settings.code_version, adapt_entry=adapt_entry)


def build_deps(
    store: Store,
    resolver: DirectoryResolver,
    settings: Settings,
    *,
    live: LiveHub | None = None,
    providers: Mapping[str, ModelProvider] | None = None,
) -> TickDeps:
    """The deps of a tick. Agent-bound providers come from the resolver; ``providers`` are
    runtime-wide fallbacks (``scripted`` is always there, for ``scripted:echo``)."""
    return TickDeps(
        store=store,
        agents=resolver,
        providers=dict(providers if providers is not None else runtime_providers()),
        settings=settings,
        code_version=settings.code_version,
        # Agents price their own calls (agent.yaml ``pricing:``); this is the fallback.
        pricing=make_pricing(default_table()),
        live=live,
    )


async def open_runtime(
    agents_root: str | Path,
    database_url: str | None = None,
    settings: Settings | None = None,
    *,
    live: LiveHub | None = None,
) -> Runtime:
    """Open (and migrate) the store and assemble the deps. ``database_url`` defaults to the
    settings' URL; close with :func:`close_runtime`."""
    settings = settings or Settings.from_env()
    root = Path(agents_root).resolve()
    url = database_url or settings.database_url
    settings = settings.with_(database_url=url)
    store = await connect(url)
    hub = live or LiveHub()
    providers = runtime_providers()
    resolver = make_resolver(root, settings)
    deps = build_deps(store, resolver, settings, live=hub, providers=providers)
    return Runtime(root, store, resolver, deps, hub, settings, providers)


async def close_runtime(runtime: Runtime) -> None:
    await runtime.resolver.aclose()
    for provider in runtime.providers.values():
        closer = getattr(provider, "aclose", None)
        if closer is not None:
            await closer()
    await runtime.store.close()
