"""``DirectoryResolver``: the :class:`AgentResolver` over agent directories, with the
MCP servers and agent-bound providers it owns.

Resolving is cheap and repeatable: the engine resolves (agent, process) on every tick. A
directory is reloaded only when its content hash changes, an MCP server is started once
per (directory, content hash), and providers are built once per definition.
"""

from __future__ import annotations

import functools
import operator
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from toren.agents.config import ProviderConfig, parse_model_ref
from toren.agents.entries import EntryAdapter
from toren.agents.loader import (
    AGENT_FILE,
    IGNORED_DIRS,
    AgentDefinition,
    directory_hash,
    is_code_path,
    load_agent,
)
from toren.agents.mcp_tools import McpServer
from toren.agents.readiness import check_providers, missing_key_message
from toren.core.agent_api.program import AgentProgram
from toren.errors import AgentConfigError, AgentNotFound, ProviderUnavailable
from toren.providers.base import DeltaCallback, ModelProvider, ModelRequest, ModelResponse

__all__ = ["DirectoryResolver", "ProviderFactory", "default_provider_factory"]


class ProviderFactory(Protocol):
    """Builds the provider an agent's model refs use (``AgentProgram.providers``).

    Called once per provider name an agent uses or declares, with its implementation
    type (openai, anthropic, scripted), its ``providers:`` settings (defaults if none)
    and the agent directory (the scripted provider reads its script from there).
    Returning ``None`` leaves the name to the runtime-wide providers.
    """

    def __call__(
        self, name: str, type: str, config: ProviderConfig, root: Path
    ) -> ModelProvider | None: ...


def default_provider_factory(
    name: str, type: str, config: ProviderConfig, root: Path
) -> ModelProvider | None:
    """Agent-bound providers from agent.yaml: ``scripted`` reads scripts from the agent
    directory; an openai/anthropic provider is built only when ``providers:`` configures
    it (otherwise the runtime-wide one serves). Construction, and the read of
    ``api_key_env``, happens at the first call, so resolving an agent never needs a key."""
    if type == "scripted":
        from toren.providers.scripted import ScriptedProvider

        return ScriptedProvider(base_dir=root)
    if config == ProviderConfig(type=config.type):
        return None
    return _LazyProvider(name, type, config)


class _LazyProvider:
    def __init__(self, name: str, type: str, config: ProviderConfig) -> None:
        self.name = name
        self.type = type
        self.config = config
        self._provider: ModelProvider | None = None

    def _build(self) -> ModelProvider:
        from toren.providers.base import RetryPolicy
        from toren.providers.registry import build_provider

        options: dict[str, object] = {}
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env)
            if not key:
                raise ProviderUnavailable(
                    missing_key_message(self.type, self.name, self.config.api_key_env),
                    provider=self.name,
                )
            options["api_key"] = key
        if self.config.base_url:
            options["base_url"] = self.config.base_url
        if self.config.timeout is not None:
            options["timeout"] = self.config.timeout
        if self.config.max_retries is not None:
            options["retry"] = RetryPolicy(max_attempts=self.config.max_retries + 1)
        return build_provider(self.type, **options)

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        if self._provider is None:
            self._provider = self._build()
        return await self._provider.complete(request, on_delta=on_delta)

    async def aclose(self) -> None:
        closer = getattr(self._provider, "aclose", None)
        if closer is not None:
            await closer()


# -- the resolver -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Made:
    """A program :meth:`DirectoryResolver.resolve` made, and what it made it of."""

    definition: AgentDefinition
    servers: tuple[McpServer, ...]
    listings: tuple[object, ...]  # each server's tool listing (a restart lists anew)
    providers: dict[str, ModelProvider]
    program: AgentProgram

    def of(
        self,
        definition: AgentDefinition,
        servers: tuple[McpServer, ...],
        providers: dict[str, ModelProvider],
    ) -> bool:
        return (
            self.definition is definition
            and self.providers == providers  # the same provider objects (none: {})
            and len(self.servers) == len(servers)
            and all(map(operator.is_, self.servers, servers))
            and all(map(operator.is_, self.listings, (s.listing for s in servers)))
        )


class DirectoryResolver:
    """An :class:`AgentResolver` over agent directories.

    ``root_or_dirs`` is one agent directory, a directory whose subdirectories are agent
    directories, or a list of either. Agents reload when their files change (the content
    hash is checked on every ``resolve``, so ``toren dev`` sees edits as a new code
    version). ``close()`` stops the MCP servers it started.

    ``provider_factory`` builds each agent's own providers (``AgentProgram.providers``);
    the default is :func:`default_provider_factory`, ``None`` disables agent-bound
    providers. ``code_version`` overrides the directory hash (e.g. from
    ``TOREN_CODE_VERSION``, read by the caller). ``adapt_entry`` lets an ``entry:`` name a
    framework's agent object (``toren.integrations.adapt_entry``; see
    :mod:`toren.agents.entries`).
    """

    def __init__(
        self,
        root_or_dirs: str | Path | Iterable[str | Path],
        *,
        code_version: str | None = None,
        provider_factory: ProviderFactory | None = default_provider_factory,
        mcp_startup_timeout: float = 30.0,
        adapt_entry: EntryAdapter | None = None,
    ) -> None:
        if isinstance(root_or_dirs, (str, Path)):
            root_or_dirs = [root_or_dirs]
        self.roots = [Path(p).resolve() for p in root_or_dirs]
        self.code_version = code_version
        self.provider_factory = provider_factory
        self.mcp_startup_timeout = mcp_startup_timeout
        self.adapt_entry = adapt_entry
        self._lock = threading.RLock()
        self._loaded: dict[Path, AgentDefinition] = {}
        self._mcp: dict[tuple[Path, str], tuple[str, McpServer]] = {}
        self._providers_cache: dict[Path, tuple[str, dict[str, ModelProvider]]] = {}
        # The program last made per (directory, process), with what it was made of.
        self._programs: dict[tuple[Path, str], _Made] = {}

    def __enter__(self) -> DirectoryResolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def agent_dirs(self) -> dict[str, Path]:
        """Agent name -> directory. The name is agent.yaml's ``name`` (the directory name
        when the file is too broken to tell)."""
        found: dict[str, Path] = {}
        for directory in self._candidates():
            name = _peek_name(directory / AGENT_FILE) or directory.name
            if name in found:
                raise AgentConfigError(
                    f"{directory / AGENT_FILE}: at 'name': found {name!r}, which "
                    f"{found[name] / AGENT_FILE} also uses; expected agent names unique "
                    "across the project",
                    file=str(directory / AGENT_FILE),
                    key="name",
                )
            found[name] = directory
        return found

    def _candidates(self) -> list[Path]:
        out = []
        for root in self.roots:
            if (root / AGENT_FILE).is_file():
                out.append(root)
            elif root.is_dir():
                out += [d for d in sorted(root.iterdir()) if (d / AGENT_FILE).is_file()]
        return out

    def is_code_change(self, path: str | Path) -> bool:
        """Whether a change at ``path`` can change an agent's code: a file its directory's
        hash counts (:func:`~toren.agents.loader.is_code_path`, the rule of the code
        version), or a directory that may hold or be an agent. ``toren dev`` watches with
        it, so a README edit does not even wake the reload."""
        path = Path(path).resolve()
        for root in self.roots:
            if not path.is_relative_to(root):
                continue
            rel = path.relative_to(root)
            if not (root / AGENT_FILE).is_file():  # a root of agent directories
                top = rel.parts[0] if rel.parts else ""
                # Hidden and tool directories beside the agents (.toren/ with the
                # database and its journal, .git/, .venv/) hold no agent.
                if top.startswith(".") or top in IGNORED_DIRS:
                    return False
                if len(rel.parts) == 1:  # an agent directory itself, made or removed
                    return path.is_dir() or path in self._loaded
                rel = Path(*rel.parts[1:])
            if is_code_path(rel / "x" if path.is_dir() else rel):
                return True
        return False

    def names(self) -> list[str]:
        return sorted(self.agent_dirs())

    def load(self, agent: str) -> AgentDefinition:
        """The current definition of ``agent``, reloaded if its directory changed."""
        dirs = self.agent_dirs()
        if agent not in dirs:
            raise AgentNotFound(
                f"unknown agent {agent!r}; known agents: {sorted(dirs) or 'none'} "
                f"(looked in {', '.join(map(str, self.roots))})"
            )
        directory = dirs[agent]
        with self._lock:
            cached = self._loaded.get(directory)
            if cached is not None and cached.content_hash == directory_hash(directory):
                return cached
            definition = load_agent(
                directory, code_version=self.code_version, adapt_entry=self.adapt_entry
            )
            self._loaded[directory] = definition
            return definition

    def check_ready(self, agent: str) -> None:
        """Refuse, before a run is created, what would block it from its first model
        call: a provider of the agent with no API key nor base URL in this process's
        environment (:mod:`toren.agents.readiness`). Only meaningful where the run will
        execute with this environment (``toren run``, an API with in-process workers)."""
        if self.provider_factory is default_provider_factory:
            check_providers(self.load(agent))

    def resolve(self, agent: str, process: str) -> AgentProgram:
        """The program of ``agent``'s ``process``: the same object for as long as what it
        is made of is the same (the loaded definition, its MCP servers, its providers), a
        new one once the directory changed. A worker's kept (sticky) tick continues only
        under the very program it runs (:mod:`toren.core.drivers.resume`): a program made
        afresh on every call would have every wake replay."""
        definition = self.load(agent)
        proc = definition.process(process)
        servers = tuple(self._mcp_server(definition, name) for name in proc.mcp_servers)
        providers = self._providers(definition)
        key = (definition.root, process)
        with self._lock:
            made = self._programs.get(key)
            if made is not None and made.of(definition, servers, providers):
                return made.program
        listings = tuple(server.listing for server in servers)  # before the tools are read
        program = definition.program(
            process,
            mcp_tools={
                name: server.tools() for name, server in zip(proc.mcp_servers, servers, strict=True)
            },
            providers=providers,
        )
        with self._lock:
            self._programs[key] = _Made(definition, servers, listings, providers, program)
        return program

    def _mcp_server(self, definition: AgentDefinition, server: str) -> McpServer:
        key = (definition.root, server)
        config = definition.config.mcp_servers[server]
        with self._lock:
            current = self._mcp.get(key)
            if current is not None and current[0] != definition.content_hash:
                current[1].close()
                current = None
            if current is None:
                handle = McpServer(
                    server,
                    config,
                    root=definition.root,
                    source=str(definition.file),
                    startup_timeout=self.mcp_startup_timeout,
                )
                handle.start()
                current = (definition.content_hash, handle)
                self._mcp[key] = current
            return current[1]

    def _providers(self, definition: AgentDefinition) -> dict[str, ModelProvider]:
        if self.provider_factory is None:
            return {}
        with self._lock:
            cached = self._providers_cache.get(definition.root)
            if cached is None or cached[0] != definition.content_hash:
                cached = (definition.content_hash, self._build_providers(definition))
                self._providers_cache[definition.root] = cached
            return cached[1]

    def _build_providers(self, definition: AgentDefinition) -> dict[str, ModelProvider]:
        assert self.provider_factory is not None
        used = {
            parse_model_ref(p.model)[0] for p in definition.processes.values() if p.model
        } | set(definition.config.providers)
        out: dict[str, ModelProvider] = {}
        for name in sorted(used):
            config = definition.config.providers.get(name) or ProviderConfig()
            provider = self.provider_factory(
                name, definition.provider_types[name], config, definition.root
            )
            if provider is not None:
                out[name] = provider
        return out

    def close(self) -> None:
        with self._lock:
            servers, self._mcp = list(self._mcp.values()), {}
            self._programs = {}
        for _, handle in servers:
            handle.close()

    async def aclose(self) -> None:
        """:meth:`close`, and close the HTTP clients of the providers built so far."""
        self.close()
        with self._lock:
            cached, self._providers_cache = list(self._providers_cache.values()), {}
            loaded = list(self._loaded.values())
        for definition in loaded:  # a framework agent's own HTTP clients
            for process in definition.processes.values():
                closer = getattr(process.entry_fn, "aclose", None)
                if closer is not None:
                    await closer()
        for _, providers in cached:
            for provider in providers.values():
                closer = getattr(provider, "aclose", None)
                if closer is not None:
                    await closer()


def _peek_name(file: Path) -> str | None:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return _name_in(text)


@functools.lru_cache(maxsize=256)
def _name_in(text: str) -> str | None:
    """The ``name`` an agent.yaml's text gives, parsed once per distinct text: every
    ``resolve`` asks every agent directory its name (a tick resolves its run's agent),
    and the YAML parser took ~0.5 ms a file where reading it takes microseconds. Keyed by
    the text itself, so an edited file is parsed afresh at once."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None
