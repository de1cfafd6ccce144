"""Agent directories: load and check ``agent.yaml``, ``tools.py`` and the entry module
into an :class:`AgentDefinition` (``resolver.py`` turns it into the engine's programs).

Every mistake in an agent directory is reported as one :class:`AgentConfigError` naming
the file, the line, the key path, what was found and what is expected. A broken agent
never surfaces as a bare traceback or a pydantic dump.

Agent code (``tools.py``, the ``entry`` module) is imported as a package private to the
directory and its content hash, ``_toren_agent_<name>_<hash>``: two agents may both
have a ``tools.py``, and an edited directory loads fresh code under a new name (this is
what ``toren dev`` relies on) while runs still holding the old program keep working.
Inside agent code, import sibling modules relatively (``from .helpers import x``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import types
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from toren._yamlcheck import parse_yaml
from toren.agents.config import (
    BUILTIN_TOOLS,
    KNOWN_PROVIDER_TYPES,
    AgentConfig,
    HumanConfig,
    LimitsConfig,
    ProcessConfig,
    apply_deprecations,
    parse_model_ref,
)
from toren.agents.diagnostics import (
    Loc,
    Problem,
    config_error,
    describe_found,
    problems_from_pydantic,
)
from toren.agents.entries import EntryAdapter, EntryRefused, entry_providers, entry_tools
from toren.agents.loop import LoopSpec, make_loop
from toren.agents.pricing import PriceTable, default_table
from toren.agents.tools import tools_from_module
from toren.core.agent_api.program import AgentFn, AgentProgram, Limits, ToolDef, usd
from toren.core.contract.flow import Concurrency
from toren.errors import AgentConfigError, AgentNotFound
from toren.providers._wire import ANTHROPIC_REFUSAL, anthropic_refused
from toren.providers.base import ModelProvider
from toren.providers.scripted import ECHO_MODEL, load_script

__all__ = [
    "IGNORED_DIRS",
    "AgentDefinition",
    "ProcessDefinition",
    "code_files",
    "directory_hash",
    "is_code_path",
    "load_agent",
    "parse_yaml",
]

AGENT_FILE = "agent.yaml"
TOOLS_FILE = "tools.py"
# Directories never part of the agent's code, at any depth. Every hidden directory is
# left out too (the leading-dot rule of `is_code_path`); the hidden names here are the
# ones this set listed before that rule, kept so that it still names all it did.
IGNORED_DIRS = frozenset(
    {
        ".toren",
        "__pycache__",
        ".git",
        ".venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        "venv",
    }
)
# Directories left out only at the top of the agent directory: an agent may well keep a
# prompt under prompts/tests/, but a top-level tests/ or docs/ is the project's own.
_TOP_LEVEL_DIRS = frozenset({"docs", "doc", "tests", "test"})
# Documentation by name: README.* at any depth, the others at the top only (any case;
# no extension or a documentation one, so a module named license.py still counts).
_DOC_STEMS = frozenset(
    {"changelog", "license", "licence", "copying", "notice", "authors", "contributing"}
)
_DOC_SUFFIXES = frozenset({"", ".md", ".rst", ".txt", ".markdown", ".adoc"})
# Editor swap, backup and lock files, compiled Python, OS litter. (Hidden names, such as
# ``.DS_Store``, Emacs's ``.#tools.py`` and vim's ``.tools.py.swp``, are left out as such.)
_JUNK_SUFFIXES = (
    ".pyc",
    ".pyo",
    ".swp",
    ".swo",
    ".swx",
    ".bak",
    ".orig",
    ".tmp",
    "~",
    "___jb_tmp___",  # JetBrains IDEs' safe write
    "___jb_old___",
)
_JUNK_NAMES = frozenset({"thumbs.db", "desktop.ini"})
# Vim checks that it may write a directory by creating and deleting the file "4913"
# (then "5036", "5159", ... while one exists): 4913 + 123 * k.
_VIM_PROBE, _VIM_PROBE_STEP = 4913, 123


def _is_vim_probe(name: str) -> bool:
    return (
        name.isascii()
        and name.isdigit()
        and int(name) >= _VIM_PROBE
        and (int(name) - _VIM_PROBE) % _VIM_PROBE_STEP == 0
    )


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessDefinition:
    """One process with the top-level settings merged in."""

    name: str
    description: str
    model: str | None
    instructions: str
    tools: tuple[str, ...]  # from tools.py, plus built-ins
    mcp_servers: tuple[str, ...]
    model_params: Mapping[str, object]
    limits: Limits
    entry: str | None
    entry_fn: AgentFn | None = None
    concurrency: Concurrency | None = None
    on_tool_error: str = "continue"  # the built-in loop's; see agent.yaml's on_tool_error

    @property
    def uses_builtin_loop(self) -> bool:
        return self.entry_fn is None


@dataclass(frozen=True)
class AgentDefinition:
    """A loaded, checked agent directory."""

    name: str
    description: str
    root: Path
    file: Path
    config: AgentConfig
    code_version: str
    content_hash: str
    processes: Mapping[str, ProcessDefinition]
    tools: Mapping[str, ToolDef]  # every tool of tools.py
    prices: PriceTable = field(default_factory=default_table)
    provider_types: Mapping[str, str] = field(default_factory=dict)

    def program(
        self,
        process: str = "main",
        *,
        mcp_tools: Mapping[str, Mapping[str, ToolDef]] | None = None,
        providers: Mapping[str, ModelProvider] | None = None,
    ) -> AgentProgram:
        """The program for ``process``. ``mcp_tools`` maps server name -> its tools
        (the resolver starts the servers); ``providers`` are agent-bound providers."""
        proc = self.process(process)
        tools = {name: self.tools[name] for name in proc.tools if name in self.tools}
        for server in proc.mcp_servers:
            for name, tool in (mcp_tools or {}).get(server, {}).items():
                if name in tools:
                    raise AgentConfigError(
                        f"{self.file}: at 'mcp_servers.{server}': found the tool {name!r}, "
                        f"which tools.py (or another server) also defines; expected unique "
                        f"tool names (set 'mcp_servers.{server}.prefix' to tell them apart)",
                        file=str(self.file),
                        key=f"mcp_servers.{server}",
                    )
                tools[name] = tool
        program_tools: Mapping[str, ToolDef] = tools
        program_providers: Mapping[str, ModelProvider] = dict(providers or {})
        if proc.entry_fn is not None:
            # A framework agent's requests carry its own provider names, and its tool
            # calls its own tool names: its adapter's providers and tools serve them (the
            # adapter's mappings answer names known only at run time, such as MCP tools).
            program_providers = ChainMap(
                cast("dict[str, ModelProvider]", entry_providers(proc.entry_fn)),
                dict(program_providers),
            )
            framework_tools = entry_tools(proc.entry_fn)
            if framework_tools is not None:
                program_tools = ChainMap(tools, cast("dict[str, ToolDef]", framework_tools))
        return AgentProgram(
            agent=self.name,
            process=proc.name,
            fn=proc.entry_fn or make_loop(self._loop_spec(proc, tools)),
            tools=program_tools,
            code_version=self.code_version,
            limits=proc.limits,
            processes=tuple(self.processes),
            providers=program_providers,
            pricing=self.prices.cost,
            schedules=tuple(s.definition(self.name) for s in self.config.schedules),
            concurrency=proc.concurrency,
            rate_limits={k: v.value() for k, v in self.config.rate_limits.items()},
        )

    def process(self, name: str) -> ProcessDefinition:
        try:
            return self.processes[name]
        except KeyError:
            raise AgentNotFound(
                f"agent {self.name!r} has no process {name!r}; its processes are "
                f"{sorted(self.processes)} (declared under 'processes:' in {self.file})",
                process=name,
            ) from None

    def _loop_spec(self, proc: ProcessDefinition, tools: Mapping[str, ToolDef]) -> LoopSpec:
        assert proc.model is not None  # checked at load time
        human: HumanConfig | None = None
        if "ask_human" in proc.tools and "ask_human" not in tools:
            human = self.config.human
        return LoopSpec(
            agent=self.name,
            process=proc.name,
            model=proc.model,
            instructions=proc.instructions,
            tools=tuple(t.spec for t in tools.values()),
            params=proc.model_params,
            limits=proc.limits,
            human=human,
            on_tool_error=proc.on_tool_error,
        )


# -- code version -----------------------------------------------------------------------
#
# What the default code version depends on. One rule, `is_code_path`, decides both the
# hash and what `toren dev` reloads for, so a README edit is neither a new version nor a
# reload, and every file the agent's code may read at run time (agent.yaml, Python
# modules, prompts, scripts, data files) is both. The rule leaves out only what no running
# agent reads: documentation, tests, VCS and tool state, editor files. Changing it changes
# the code version of every directory holding such files (a one-time, rolling-deploy-like
# version change: see CHANGELOG, 0.1.0, "Code version"); the hash of the files that
# count is unchanged ("toren.agentdir.v1"), so a directory with nothing left out keeps
# its version.


def is_code_path(rel: str | Path) -> bool:
    """Whether the file at ``rel`` (relative to the agent directory) is part of the
    agent's code version. Left out: hidden files and directories (``.git/``, ``.toren/``,
    ``.venv/``, ``.env``, ``.gitignore``, editor swap files such as ``.tools.py.swp``);
    ``__pycache__/``, ``node_modules/``, ``venv/``; top-level ``docs/``, ``doc/``,
    ``tests/``, ``test/``; ``test_*.py``, ``*_test.py`` and ``conftest.py``; ``README``
    (bare or ``.md``, ``.rst``, ``.txt``, ``.markdown``, ``.adoc``; any case) at any depth
    and, at the top, ``CHANGELOG``, ``LICENSE``/``LICENCE``, ``COPYING``, ``NOTICE``,
    ``AUTHORS``, ``CONTRIBUTING`` spelled the same way; editor backups and compiled Python
    (``*~``, ``#*#``, ``*.swp``, ``*.bak``, ``*.orig``, ``*.tmp``, ``*.pyc``,
    ``*___jb_tmp___``, ``*___jb_old___``, ``~$*``), vim's write probe (``4913``, and
    ``5036``, ``5159``, ... when that exists) and ``Thumbs.db``, ``desktop.ini``."""
    parts = Path(rel).parts
    if not parts:
        return False
    *dirs, name = parts
    if any(d.startswith(".") or d in IGNORED_DIRS for d in dirs):
        return False
    if dirs and dirs[0].lower() in _TOP_LEVEL_DIRS:
        return False
    lower = name.lower()
    if name.startswith((".", "#", "~$")) or lower.endswith(_JUNK_SUFFIXES):
        return False
    if lower in _JUNK_NAMES or _is_vim_probe(name):
        return False
    stem, dot, suffix = lower.partition(".")
    if (stem == "readme" or (stem in _DOC_STEMS and not dirs)) and (
        (dot + suffix) in _DOC_SUFFIXES
    ):
        return False
    return not (
        lower.endswith(".py")
        and (lower.startswith("test_") or lower.endswith("_test.py") or lower == "conftest.py")
    )


def code_files(root: str | Path) -> list[Path]:
    """The files of the agent directory ``root`` its code version depends on
    (:func:`is_code_path`), in the order the hash reads them."""
    root = Path(root)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if is_code_path(rel_dir / d / "x")  # prune whole subtrees
        )
        files += [base / f for f in filenames if is_code_path(rel_dir / f)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def directory_hash(root: str | Path) -> str:
    """A hash of the agent directory's code (:func:`code_files`): sorted relative paths
    and file contents. It is the default code version, recorded on every event."""
    root = Path(root)
    digest = hashlib.sha256(b"toren.agentdir.v1\n")
    for path in code_files(root):
        rel = path.relative_to(root).as_posix().encode()
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # gone since the walk (an editor's probe file)
            continue
        digest.update(b"%d:%s\0%d:" % (len(rel), rel, len(data)))
        digest.update(data)
    return digest.hexdigest()[:16]


# -- loading agent code -----------------------------------------------------------------


def _package(name: str, root: Path, content_hash: str) -> str:
    safe = re.sub(r"\W", "_", name)
    package = f"_toren_agent_{safe}_{content_hash}"
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [str(root)]
        module.__package__ = package
        module.__file__ = None
        sys.modules[package] = module
    return package


def _error_line(exc: BaseException, file: Path) -> int | None:
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename) == file:
            line = frame.lineno
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename) == file:
        line = exc.lineno
    return line


def _function_line(fn: Any) -> int | None:
    try:
        return inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        return None


def _code_problem(file: Path, exc: BaseException, what: str, expected: str) -> AgentConfigError:
    line = _error_line(exc, file)
    where = f"{file}:{line}" if line else str(file)
    return AgentConfigError(
        f"{where}: {what}: found {type(exc).__name__}: {exc}; expected {expected}",
        file=str(file),
        key=what,
    )


# -- the loader -------------------------------------------------------------------------


def _locate(path: str | Path) -> tuple[Path, Path]:
    path = Path(path).resolve()
    if path.is_dir():
        file = path / AGENT_FILE
        if not file.is_file():
            raise AgentConfigError(
                f"{path}: found a directory without {AGENT_FILE}; expected an agent "
                f"directory containing {AGENT_FILE} (create one with 'toren init')",
                file=str(file),
            )
        return path, file
    if not path.is_file():
        raise AgentConfigError(
            f"{path}: found nothing (no such file or directory); expected an agent "
            f"directory or its {AGENT_FILE}",
            file=str(path),
        )
    return path.parent, path


def load_agent(
    path: str | Path,
    *,
    code_version: str | None = None,
    adapt_entry: EntryAdapter | None = None,
) -> AgentDefinition:
    """Load and check the agent in directory ``path`` (or at ``path``/agent.yaml).

    ``code_version`` overrides the directory hash as the recorded code version (e.g. the
    image's git SHA from ``TOREN_CODE_VERSION``; the caller reads the environment).
    ``adapt_entry`` turns an ``entry:`` naming a framework's agent object into an agent
    function (``toren.integrations.adapt_entry``, injected by ``toren.runtime``); without
    it an entry must name an async function. Raises :class:`AgentConfigError` for
    anything wrong with the directory.
    """
    root, file = _locate(path)
    return _AgentLoader(root, file, adapt_entry).load(code_version)


class _AgentLoader:
    def __init__(self, root: Path, file: Path, adapt_entry: EntryAdapter | None = None) -> None:
        self.root = root
        self.file = file
        self.adapt_entry = adapt_entry
        self.src = str(file)
        self.lines: dict[Loc, int] = {}
        self.problems: list[Problem] = []

    def fail(self, problems: Sequence[Problem]) -> AgentConfigError:
        return config_error(self.src, problems, self.lines)

    def problem(self, path: Loc, found: str, expected: str) -> None:
        self.problems.append(Problem(path, found, expected))

    def load(self, code_version: str | None) -> AgentDefinition:
        config = self._config()
        content_hash = directory_hash(self.root)
        tools = self._tools(config, content_hash)
        providers = self._provider_types(config)
        processes = {
            name: self._process(config, name, proc, tools, providers, content_hash)
            for name, proc in {"main": ProcessConfig(), **config.processes}.items()
        }
        prices = default_table().with_overrides(config.pricing)
        for name, process in processes.items():
            self._check_budget(config, name, process, prices)
        if self.problems:
            raise self.fail(self.problems)
        return AgentDefinition(
            name=config.name,
            description=config.description or "",
            root=self.root,
            file=self.file,
            config=config,
            code_version=code_version or content_hash,
            content_hash=content_hash,
            processes=processes,
            tools=tools,
            prices=prices,
            provider_types=providers,
        )

    # agent.yaml itself

    def _config(self) -> AgentConfig:
        try:
            text = self.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AgentConfigError(
                f"{self.src}: found an unreadable file ({exc}); expected a UTF-8 text file",
                file=self.src,
            ) from None
        data, self.lines = parse_yaml(text, self.src)
        if not isinstance(data, dict):
            found = "an empty file" if data is None else describe_found(data)
            raise self.fail(
                [Problem((), found, "a mapping of keys to values, at least 'name' and 'model'")]
            )
        try:
            data = apply_deprecations(data, where=self.src)
        except ValueError as exc:
            raise AgentConfigError(str(exc), file=self.src) from None
        try:
            return AgentConfig.model_validate(data)
        except ValidationError as exc:
            raise self.fail(problems_from_pydantic(exc, data, AgentConfig)) from None

    def _provider_types(self, config: AgentConfig) -> dict[str, str]:
        types_: dict[str, str] = {name: name for name in KNOWN_PROVIDER_TYPES}
        for name, provider in config.providers.items():
            kind = provider.type or (name if name in KNOWN_PROVIDER_TYPES else None)
            if kind is None:
                self.problem(
                    ("providers", name, "type"),
                    "nothing",
                    f"the implementation of provider {name!r}, one of "
                    f"{list(KNOWN_PROVIDER_TYPES)} (e.g. 'type: openai' for an "
                    "OpenAI-compatible server)",
                )
                continue
            types_[name] = kind
        return types_

    # tools.py

    def _tools(self, config: AgentConfig, content_hash: str) -> dict[str, ToolDef]:
        path = self.root / TOOLS_FILE
        if not path.is_file():
            return {}
        package = _package(config.name, self.root, content_hash)
        try:
            module = importlib.import_module(f"{package}.tools")
        except Exception as exc:
            raise _code_problem(
                path, exc, "importing tools.py", "a tools.py that imports cleanly"
            ) from None
        try:
            return tools_from_module(module)
        except TypeError as exc:
            line = _function_line(getattr(exc, "function", None))
            raise AgentConfigError(
                f"{path}{f':{line}' if line else ''}: found {exc}; "
                "expected tool functions with named, typed parameters "
                "(str, int, float, bool, list[...], dict[...], Literal, enums, pydantic models)",
                file=str(path),
            ) from None

    # processes

    def _process(
        self,
        config: AgentConfig,
        name: str,
        proc: ProcessConfig,
        tools: Mapping[str, ToolDef],
        providers: Mapping[str, str],
        content_hash: str,
    ) -> ProcessDefinition:
        def pick(key: str) -> tuple[Any, Loc]:
            if key in proc.model_fields_set:
                return getattr(proc, key), ("processes", name, key)
            return getattr(config, key), (key,)

        entry, entry_loc = pick("entry")
        model, model_loc = pick("model")
        tool_names, tools_loc = pick("tools")
        entry_fn = self._entry(entry, entry_loc, config, content_hash) if entry else None
        if model is None and entry is None:
            self.problem(
                model_loc,
                describe_found(None) if "model" in proc.model_fields_set else "nothing",
                "a model reference such as 'openai:gpt-4o-mini' (required unless the "
                "process names an 'entry:')",
            )
        elif model is not None:
            self._check_model(model, model_loc, providers)
            self._check_params(config, proc, name, model, providers)
        return ProcessDefinition(
            name=name,
            description=proc.description or (config.description if name == "main" else "") or "",
            model=model,
            instructions=self._instructions(config, proc, name),
            tools=self._tool_names(tool_names, tools_loc, tools),
            mcp_servers=self._mcp_names(config, proc, name),
            model_params=_merge_params(config, proc),
            limits=_merge_limits(config.limits, proc.limits),
            entry=entry,
            entry_fn=entry_fn,
            concurrency=concurrency.value() if (concurrency := pick("concurrency")[0]) else None,
            on_tool_error=pick("on_tool_error")[0] or "continue",
        )

    def _check_budget(
        self, config: AgentConfig, name: str, process: ProcessDefinition, prices: PriceTable
    ) -> None:
        """A budget is enforced from the price table's estimates: for a model the table
        does not price, every call would count as $0 and the budget would never stop the
        run. Refused here, where the fix (a ``pricing:`` entry) is one line away."""
        model = process.model
        if process.limits.max_cost_usd is None or model is None or prices.lookup(model):
            return
        proc = config.processes.get(name)
        overridden = (
            proc is not None
            and proc.limits is not None
            and ("max_cost_usd" in proc.limits.model_fields_set)
        )
        loc: Loc = (
            ("processes", name, "limits", "max_cost_usd")
            if overridden
            else ("limits", "max_cost_usd")
        )
        problem = Problem(
            loc,
            f"a budget for {model!r}, a model the price table does not know (its calls "
            "would be counted as $0 and never reach the budget)",
            f"a price for it under 'pricing:' ({model}: {{input_usd_per_mtok: ..., "
            "output_usd_per_mtok: ...}), or no max_cost_usd",
        )
        if problem not in self.problems:  # processes inheriting one budget: said once
            self.problems.append(problem)

    def _mcp_names(self, config: AgentConfig, proc: ProcessConfig, name: str) -> tuple[str, ...]:
        if proc.mcp_servers is None:
            return tuple(config.mcp_servers)
        for index, server in enumerate(proc.mcp_servers):
            if server not in config.mcp_servers:
                self.problem(
                    ("processes", name, "mcp_servers", index),
                    f"the server {server!r}",
                    "a server declared under the top-level 'mcp_servers:' (declared: "
                    f"{', '.join(config.mcp_servers) or 'none'})",
                )
        return tuple(s for s in proc.mcp_servers if s in config.mcp_servers)

    def _check_model(self, model: str, loc: Loc, providers: Mapping[str, str]) -> None:
        provider, model_name = parse_model_ref(model)
        if provider not in providers:
            self.problem(
                loc,
                f"the provider {provider!r} in {model!r}",
                f"one of {sorted(providers)} or a provider declared under 'providers:' "
                "(e.g. 'openai:gpt-4o-mini')",
            )
        elif providers[provider] == "scripted":
            self._check_script(model, loc, provider, model_name)

    def _check_params(
        self,
        config: AgentConfig,
        proc: ProcessConfig,
        name: str,
        model: str,
        providers: Mapping[str, str],
    ) -> None:
        """Settings the model's API refuses fail the load, not every run's first call."""
        if providers.get(parse_model_ref(model)[0]) != "anthropic":
            return
        for owner, prefix in ((config, ()), (proc, ("processes", name))):
            params = owner.model_params.as_params() if owner.model_params else {}
            for key in anthropic_refused(params):
                problem = Problem(
                    (*prefix, "model_params", key),
                    f"{key} for the anthropic model {model!r}",
                    f"no {key}: {ANTHROPIC_REFUSAL}; leave it out (max_tokens, stop and "
                    "the other settings pass through)",
                )
                if problem not in self.problems:  # top-level params: once, not per process
                    self.problems.append(problem)

    def _check_script(self, model: str, loc: Loc, provider: str, name: str) -> None:
        path = self.root / name
        if name == ECHO_MODEL:  # built in: no script, and never a file of that name
            if path.is_file():
                self.problem(
                    loc,
                    f"{model!r} beside a file {name!r} in {self.root}, but {model!r} is the "
                    "built-in echo model (it replies with the last user message) and never "
                    "reads that file",
                    f"'{provider}:./{name}' to use the file as the script, or another name "
                    f"for the file to keep {model!r} the echo model",
                )
        elif not path.is_file():
            self.problem(
                loc,
                f"{model!r}, but there is no file {name!r} in {self.root}",
                "'scripted:<file>' naming a script file relative to the agent directory, "
                f"or '{provider}:{ECHO_MODEL}' (the built-in echo model, no file)",
            )
        else:
            # Checked here, not at the first model call: a broken script must fail the
            # load (no run is created) rather than every run that uses it.
            load_script(path)

    def _instructions(self, config: AgentConfig, proc: ProcessConfig, name: str) -> str:
        owner: AgentConfig | ProcessConfig = config
        prefix: Loc = ()
        if {"instructions", "instructions_file"} & proc.model_fields_set:
            owner, prefix = proc, ("processes", name)
        if owner.instructions_file is None:
            return owner.instructions or ""
        path = self.root / owner.instructions_file
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = "no such file" if isinstance(exc, FileNotFoundError) else str(exc)
            self.problem(
                (*prefix, "instructions_file"),
                f"{owner.instructions_file!r} ({reason}: {path})",
                "a UTF-8 text file, relative to the agent directory",
            )
            return ""

    def _tool_names(
        self, names: list[str] | None, loc: Loc, tools: Mapping[str, ToolDef]
    ) -> tuple[str, ...]:
        if names is None:
            return tuple(tools)
        known = [*tools, *(b for b in BUILTIN_TOOLS if b not in tools)]
        for index, name in enumerate(names):
            if name not in known:
                source = "tools.py" if tools else f"tools.py (there is none in {self.root})"
                self.problem(
                    (*loc, index),
                    f"the tool {name!r}",
                    f"a function defined in {source} or a built-in tool; known tools: "
                    f"{', '.join(known) or 'none'}",
                )
        return tuple(dict.fromkeys(names))

    def _entry(
        self, entry: str, loc: Loc, config: AgentConfig, content_hash: str
    ) -> AgentFn | None:
        module_name, _, attr = entry.partition(":")
        rel = Path(*module_name.split("."))
        local = (self.root / rel).with_suffix(".py").is_file() or (
            self.root / rel / "__init__.py"
        ).is_file()
        target = (
            f"{_package(config.name, self.root, content_hash)}.{module_name}"
            if local
            else module_name
        )
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            hint = self._install_hint(missing)
            if hint is not None:
                self.problem(
                    loc,
                    f"{entry!r}, whose module imports {missing!r}, which is not installed",
                    f"{hint} installed where Toren runs (pip install '{hint}')",
                )
                return None
            # Only the module itself not existing is a config problem; anything else
            # (including a module it imports that is missing) is the code's.
            absent = missing is not None and not local and missing == module_name.split(".")[0]
            if not absent:
                raise _code_problem(
                    self.root / rel.with_suffix(".py"),
                    exc,
                    f"importing {entry!r}",
                    "a module that imports cleanly",
                ) from None
            self.problem(
                loc,
                f"{entry!r}, but there is no {rel.with_suffix('.py')} in {self.root} "
                f"and no installed module {module_name!r}",
                "'module:function' naming a module in the agent directory",
            )
            return None
        fn = getattr(module, attr, None)
        if fn is None:
            self.problem(
                loc,
                f"{entry!r}, but module {module_name!r} has no attribute {attr!r}",
                f"'{module_name}:<function>' naming an async function of that module",
            )
            return None
        if inspect.iscoroutinefunction(fn):
            return fn  # type: ignore[no-any-return]
        if self.adapt_entry is not None:
            try:
                adapted = self.adapt_entry(fn, where=f"{self.src}: entry {entry!r}")
            except EntryRefused as exc:
                self.problem(loc, f"{entry!r}, {exc.found}", exc.expected)
                return None
            if adapted is not None:
                return adapted
        self.problem(
            loc,
            f"{entry!r}, which is "
            + ("a plain (not async) function" if inspect.isfunction(fn) else _a(fn)),
            "an async function: 'async def main(ctx, input)'"
            + (f", or {self._frameworks()}" if self._frameworks() else ""),
        )
        return None

    def _install_hint(self, module: str | None) -> str | None:
        hint = getattr(self.adapt_entry, "install_hint", None)
        return hint(module.split(".")[0]) if hint is not None and module else None

    def _frameworks(self) -> str:
        kinds = getattr(self.adapt_entry, "kinds", ())
        return " or ".join(kinds)


def _a(obj: object) -> str:
    kind = type(obj)
    name = (
        kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    )
    return f"an object of type {name}"


def _merge_params(config: AgentConfig, proc: ProcessConfig) -> dict[str, object]:
    params = config.model_params.as_params() if config.model_params else {}
    if proc.model_params is not None:
        params.update(proc.model_params.as_params())
    return {key: params[key] for key in sorted(params)}


def _merge_limits(top: LimitsConfig | None, override: LimitsConfig | None) -> Limits:
    values: dict[str, Any] = {}
    for source in (top, override):
        if source is not None:
            values.update({key: getattr(source, key) for key in source.model_fields_set})
    cost = values.get("max_cost_usd")
    return Limits(
        max_steps=values.get("max_steps"),
        # Spelled as the float it was before 0.2 read it as (1 -> 1.0): the limit is
        # quoted in the failure messages runs record, which must not change.
        max_cost_usd=usd(float(cost)) if cost is not None else None,
        step_timeout=values.get("step_timeout"),
    )
