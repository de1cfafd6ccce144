"""The agent.yaml schema: pydantic models, deprecated aliases and the published JSON Schema.

agent.yaml is one of Toren's most settled surfaces. Below 1.0 a key may be added in a
minor; a key is renamed or removed only through :data:`DEPRECATED_KEYS`, which keeps the old
spelling working for one more minor with a :class:`TorenDeprecationWarning` naming the new
key. Every model forbids unknown keys, so a typo is an error that names the key, never a
silently ignored setting. ``docs/agent-yaml.md`` documents every key; keep it in step.

Secrets never live here: a provider names the environment variable that holds its key
(``api_key_env``), and the loader reads it only when the provider is constructed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from toren.config import RateLimit
from toren.core.contract.flow import Concurrency, parse_key
from toren.core.contract.schedule import (
    ScheduleDef,
    ScheduleError,
    ScheduleSpec,
    check_cron,
    check_every,
    check_seconds,
    check_zone,
)
from toren.deprecations import DEPRECATED_KEYS, TorenDeprecationWarning, warn_deprecated
from toren.durations import parse_duration
from toren.errors import InvalidInput

__all__ = [
    "BUILTIN_TOOLS",
    "ConcurrencyConfig",
    "DEPRECATED_KEYS",
    "KNOWN_PROVIDER_TYPES",
    "SCHEMA_URL",
    "AgentConfig",
    "HumanConfig",
    "LimitsConfig",
    "McpServerConfig",
    "ModelParams",
    "PriceConfig",
    "ProcessConfig",
    "ProviderConfig",
    "ScheduleConfig",
    "TorenDeprecationWarning",
    "agent_json_schema",
    "apply_deprecations",
    "parse_model_ref",
]

SCHEMA_URL = "https://toren.run/schema/agent.schema.json"

# Provider implementations shipped with Toren. Another name may be used in a model ref
# when ``providers:`` declares it with one of these ``type``s (e.g. an Ollama server
# declared as ``ollama: {type: openai, base_url: ...}``).
KNOWN_PROVIDER_TYPES = ("anthropic", "openai", "openai-responses", "scripted")

# Tools the built-in loop provides itself; they may be listed in ``tools:``.
BUILTIN_TOOLS = ("ask_human",)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ENTRY_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PREFIX_PATTERN = r"^[A-Za-z0-9_-]*$"
# What each pattern means, for error messages (a regex is not an explanation).
PATTERN_HELP = {
    NAME_PATTERN: "a name of letters, digits, '.', '_' or '-' starting with a letter or "
    "digit, at most 64 characters",
    ENTRY_PATTERN: "'module:function', e.g. 'agent:main'",
    ENV_VAR_PATTERN: "the name of an environment variable, e.g. OPENAI_API_KEY",
    PREFIX_PATTERN: "letters, digits, '_' or '-'",
}
_MODEL_REF = re.compile(r"^(?P<provider>[A-Za-z0-9][A-Za-z0-9_-]*):(?P<model>\S.*)$")

# Parameters that configure the connection, not the request. They are refused in
# ``model_params`` because they belong in ``providers:`` and must never enter a digest.
_TRANSPORT_KEYS = frozenset(
    {"api_key", "base_url", "headers", "extra_headers", "timeout", "max_retries", "stream"}
)


def parse_model_ref(ref: str) -> tuple[str, str]:
    """``"openai:gpt-4o-mini"`` -> ``("openai", "gpt-4o-mini")``; ValueError otherwise."""
    match = _MODEL_REF.match(ref)
    if not match:
        raise ValueError(
            f"a model reference 'provider:model' such as 'openai:gpt-4o-mini', "
            f"'anthropic:claude-sonnet-4-5' or 'scripted:script.yaml'; found {ref!r}"
        )
    return match["provider"], match["model"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


ModelRef = Annotated[
    str,
    Field(
        description="`provider:model`, e.g. `openai:gpt-4o-mini`, "
        "`anthropic:claude-sonnet-4-5`, `scripted:script.yaml`, `scripted:echo`.",
        examples=[
            "openai:gpt-4o-mini",
            "anthropic:claude-sonnet-4-5",
            "scripted:script.yaml",
            "scripted:echo",
        ],
    ),
]


def _check_model_ref(value: str | None) -> str | None:
    if value is not None:
        parse_model_ref(value)
    return value


class LimitsConfig(_Strict):
    """Run limits. A run that reaches one fails with ``LimitExceeded`` and says which."""

    max_steps: int | None = Field(
        default=None,
        ge=1,
        description="Most steps (model calls plus tool calls) one run may take.",
    )
    max_cost_usd: Decimal | None = Field(
        default=None,
        gt=0,
        description="Budget in USD (estimated from the price table) for one run.",
    )
    step_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds one model or tool call may take before it fails.",
    )


class ModelParams(BaseModel):
    """Sampling parameters sent with every model call. Known keys are checked; other keys
    pass through to the provider unchanged (for vendor-specific parameters)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: list[str] | None = None
    seed: int | None = None

    @model_validator(mode="after")
    def _no_transport_keys(self) -> ModelParams:
        extra = set(self.model_extra or {})
        bad = sorted(extra & _TRANSPORT_KEYS)
        if bad:
            raise ValueError(
                f"{bad[0]!r} is a connection setting, not a model parameter; "
                f"set it under 'providers:' instead"
            )
        return self

    def as_params(self) -> dict[str, Any]:
        """The parameters as plain JSON values, unset ones left out (they enter digests)."""
        data = self.model_dump(exclude_none=True, mode="json")
        return {key: data[key] for key in sorted(data)}


class ProviderConfig(_Strict):
    """How to reach a provider. Keys are never written here, only the variable holding one."""

    type: Literal["openai", "openai-responses", "anthropic", "scripted"] | None = Field(
        default=None,
        description="Implementation to use; defaults to the provider's name when that is "
        "one of openai, openai-responses, anthropic, scripted. openai speaks Chat "
        "Completions, openai-responses the Responses API.",
    )
    base_url: str | None = Field(
        default=None,
        description="API base URL, e.g. http://localhost:11434/v1 for Ollama.",
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=ENV_VAR_PATTERN,
        description="Name of the environment variable holding the API key.",
    )
    timeout: float | None = Field(default=None, gt=0, description="Seconds per HTTP request.")
    max_retries: int | None = Field(
        default=None, ge=0, description="Retries on 429 and 5xx responses."
    )


class McpServerConfig(_Strict):
    """An MCP server started over stdio; its tools become the agent's tools."""

    command: str = Field(min_length=1, description="Executable to start, e.g. `npx`.")
    args: list[str] = Field(default_factory=list, description="Command-line arguments.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables (literal values, not secrets).",
    )
    cwd: str | None = Field(
        default=None, description="Working directory, relative to the agent directory."
    )
    tools: list[str] | None = Field(
        default=None, description="Only these tools of the server (default: all)."
    )
    prefix: str = Field(
        default="",
        pattern=PREFIX_PATTERN,
        description="Prepended to the server's tool names, to keep them apart.",
    )


class HumanConfig(_Strict):
    """The built-in `ask_human` tool: it waits for a message sent to the run."""

    message: str = Field(
        default="human",
        min_length=1,
        description="Name of the message the run waits for.",
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to wait before telling the model nobody answered "
        "(default: wait forever).",
    )


class PriceConfig(_Strict):
    """A price override, in USD per million tokens."""

    input_usd_per_mtok: Decimal = Field(ge=0)
    output_usd_per_mtok: Decimal = Field(ge=0)


class ConcurrencyConfig(_Strict):
    """How many runs of this process (or of one key of it) may run at once, enforced by
    the database across every worker. See docs/flow-control.md."""

    limit: int = Field(ge=1, le=1_000_000, description="Runs of one key holding a slot at once.")
    key: str | None = Field(
        default=None,
        description="A path into the run's input (`input.customer_id`): one limit per value. "
        "Omitted: one limit for the whole process.",
    )
    on_conflict: Literal["enqueue", "reject", "cancel_previous"] = Field(
        default="enqueue",
        description="A start while a run of the same key is unfinished: wait in the queue, "
        "be refused (409), or cancel the unfinished ones and wait for their slots.",
    )

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None:
            parse_key(value)
        return value

    def value(self) -> Concurrency:
        key = parse_key(self.key) if self.key is not None else ()
        return Concurrency(limit=self.limit, key=key, on_conflict=self.on_conflict)


class RateLimitConfig(_Strict):
    """A provider model's rate limit, shared by every worker through the database
    (docs/flow-control.md#provider-rate-limits)."""

    rpm: int | None = Field(
        default=None, ge=1, le=10**12, description="Model calls per period (a minute)."
    )
    tpm: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Tokens per period, estimated before each call and corrected after it.",
    )
    period: float | str = Field(
        default=60.0,
        description="The window the limits count in: seconds or a duration ('60s', '1m'). "
        "Providers publish per-minute limits: keep 60 s unless yours counts otherwise.",
    )

    def value(self) -> RateLimit:
        period = parse_duration(self.period) if isinstance(self.period, str) else self.period
        return RateLimit(rpm=self.rpm, tpm=self.tpm, period=period)

    @model_validator(mode="after")
    def _valid(self) -> RateLimitConfig:
        try:
            self.value()
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return self


class _Overridable(_Strict):
    """Keys a process may set to override the agent's top level."""

    description: str | None = None
    model: ModelRef | None = None
    instructions: str | None = Field(default=None, description="System prompt, inline.")
    instructions_file: str | None = Field(
        default=None, description="System prompt read from a file relative to the agent."
    )
    tools: list[str] | None = Field(
        default=None,
        description="Tools from tools.py (and built-ins such as `ask_human`). "
        "Omitted: every public function of tools.py. `[]`: none.",
    )
    mcp_servers: Any = None
    model_params: ModelParams | None = None
    limits: LimitsConfig | None = None
    concurrency: ConcurrencyConfig | None = Field(
        default=None,
        description="A concurrency limit, optionally keyed by a path into the input "
        "(docs/flow-control.md).",
    )
    on_tool_error: Literal["continue", "fail"] | None = Field(
        default=None,
        description="What the built-in loop does when a tool raises: `continue` (the "
        "default) gives the model the error text and goes on, and the run counts it in "
        "`tool_errors`; `fail` fails the run with the tool's error and traceback "
        "(retryable with `toren runs retry`, which runs the tool again).",
    )
    entry: str | None = Field(
        default=None,
        pattern=ENTRY_PATTERN,
        description="`module:attr` replacing the built-in loop: an async function "
        "written against the context API, or a framework's agent object (a "
        "`pydantic_ai.Agent` instance; see docs/pydantic-ai.md). The module is looked up "
        "in the agent directory first.",
    )

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str | None) -> str | None:
        return _check_model_ref(value)

    @model_validator(mode="after")
    def _one_instructions(self) -> _Overridable:
        if self.instructions is not None and self.instructions_file is not None:
            raise ValueError("set either 'instructions' or 'instructions_file', not both")
        return self


class ProcessConfig(_Overridable):
    """A named entry point of the agent. Unset keys inherit the agent's top level."""

    mcp_servers: list[str] | None = Field(
        default=None,
        description="Names of the agent's MCP servers this process uses (default: all).",
    )


class ScheduleConfig(_Strict):
    """A schedule: start a run of a process on a cron expression or an interval. See
    docs/schedules.md for the policies, the defaults and DST."""

    name: str = Field(pattern=NAME_PATTERN, description="Unique within the agent.")
    cron: str | None = Field(
        default=None,
        description="Five cron fields (minute hour day-of-month month day-of-week), "
        "matched in `zone`, e.g. `0 9 * * 1-5`. Exactly one of `cron` and `every`.",
    )
    every: float | str | None = Field(
        default=None,
        description="A fixed interval (`10m`, `1h`, or seconds), counted from the Unix "
        "epoch in whole seconds (at least 1 s).",
    )
    zone: str = Field(default="UTC", description="The IANA time zone `cron` is read in.")
    process: str = Field(default="main", description="The process each firing starts.")
    input: Any = Field(default=None, description="The input of each run it starts.")
    overlap: Literal["skip", "buffer_one", "allow_all", "cancel_previous"] = Field(
        default="skip", description="What a due time does while the last run still runs."
    )
    catch_up: Literal["latest", "all"] = Field(
        default="latest",
        description="When several times were missed: fire only the latest, or all.",
    )
    catch_up_window: float | str = Field(
        default="1d", description="A missed time older than this never fires."
    )
    jitter: float | str = Field(
        default=0, description="Fire each time up to this much later (spreads load)."
    )

    def definition(self, agent: str) -> ScheduleDef:
        return ScheduleDef(
            agent=agent,
            name=self.name,
            spec=self.spec(),
            process=self.process,
            input=self.input,
        )

    def spec(self) -> ScheduleSpec:
        return ScheduleSpec(
            cron=self.cron,
            every=None if self.every is None else _seconds(self.every, "every"),
            zone=self.zone,
            jitter=_seconds(self.jitter, "jitter"),
            overlap=self.overlap,
            catch_up=self.catch_up,
            catch_up_window=_seconds(self.catch_up_window, "catch_up_window"),
        )

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            _checked(check_cron, value)
        return value

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        _checked(check_zone, value)
        return value

    @field_validator("every")
    @classmethod
    def _every(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            _checked(check_every, _checked(lambda v: _seconds(v, "every"), value))
        return value

    @field_validator("jitter", "catch_up_window")
    @classmethod
    def _duration(cls, value: float | str, info: ValidationInfo) -> float | str:
        name = str(info.field_name)
        _checked(lambda v: check_seconds(name, _seconds(v, name)), value)
        return value

    @model_validator(mode="after")
    def _valid(self) -> ScheduleConfig:
        try:
            self.spec()
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None
        return self


def _checked(check: Callable[[Any], Any], value: Any) -> Any:
    """A schedule check's error in the words agent.yaml and the API show (the field's own
    location comes from pydantic)."""
    try:
        return check(value)
    except ScheduleError as exc:
        raise ValueError(exc.message) from None


def _seconds(value: float | str, name: str) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except InvalidInput as exc:
            raise ScheduleError(name, exc.message) from None
    return value


class AgentConfig(_Overridable):
    """The whole agent.yaml."""

    schema_: str | None = Field(default=None, alias="$schema", description="Editor hint.")
    name: str = Field(pattern=NAME_PATTERN, description="The agent's name, unique per project.")
    description: str | None = None
    mcp_servers: dict[str, McpServerConfig] = Field(
        default_factory=dict, description="MCP servers by name (stdio transport)."
    )
    providers: dict[str, ProviderConfig] = Field(
        default_factory=dict, description="Provider settings by provider name."
    )
    human: HumanConfig = Field(default_factory=HumanConfig)
    processes: dict[str, ProcessConfig] = Field(
        default_factory=dict,
        description="Named entry points. `main` always exists and takes the top-level "
        "settings; an entry here overrides them for that process.",
    )
    pricing: dict[str, PriceConfig] = Field(
        default_factory=dict,
        description="Price overrides by model ref, USD per million tokens.",
    )
    schedules: list[ScheduleConfig] = Field(
        default_factory=list,
        description="Runs this agent starts on its own, on a cron expression or an "
        "interval (docs/schedules.md).",
    )
    rate_limits: dict[str, RateLimitConfig] = Field(
        default_factory=dict,
        description="Provider rate limits by `provider:model` (`openai:gpt-4o-mini: {rpm: "
        "500, tpm: 30000}`), enforced across every worker (docs/flow-control.md).",
    )

    @field_validator("rate_limits")
    @classmethod
    def _rate_keys(cls, value: dict[str, RateLimitConfig]) -> dict[str, RateLimitConfig]:
        for key in value:
            provider, _, model = key.partition(":")
            if not provider or not model or len(key) > 255:
                raise ValueError(
                    f"rate_limits: {key!r} is not a provider and model such as 'openai:gpt-4o-mini'"
                )
        return value

    @model_validator(mode="after")
    def _schedule_names(self) -> AgentConfig:
        seen: set[str] = set()
        for schedule in self.schedules:
            if schedule.name in seen:
                raise ValueError(
                    f"schedules: the name {schedule.name!r} is used twice; expected unique "
                    "schedule names"
                )
            seen.add(schedule.name)
            if schedule.process != "main" and schedule.process not in self.processes:
                raise ValueError(
                    f"schedules: {schedule.name!r} names the process {schedule.process!r}, "
                    f"which is not declared; expected 'main' or one of "
                    f"{sorted(self.processes)} (under 'processes:')"
                )
        return self

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("processes")
    @classmethod
    def _process_names(cls, value: dict[str, ProcessConfig]) -> dict[str, ProcessConfig]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(
                    f"process name {name!r} must match {NAME_PATTERN} "
                    "(letters, digits, '.', '_', '-')"
                )
        return value

    @field_validator("pricing")
    @classmethod
    def _pricing_refs(cls, value: dict[str, PriceConfig]) -> dict[str, PriceConfig]:
        for ref in value:
            parse_model_ref(ref)
        return value


def apply_deprecations(data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Rename deprecated keys at the top level and in each process, warning once for each.

    ``where`` names the file in the warning. The old key and its replacement both present
    is an error, not a guess: :class:`ValueError` with the key path.
    """
    out = _rename(dict(data), where=where, path="")
    processes = out.get("processes")
    if isinstance(processes, Mapping):
        out["processes"] = {
            name: _rename(dict(proc), where=where, path=f"processes.{name}.")
            if isinstance(proc, Mapping)
            else proc
            for name, proc in processes.items()
        }
    return out


def _rename(data: dict[str, Any], *, where: str, path: str) -> dict[str, Any]:
    for old, (new, removed_in) in DEPRECATED_KEYS.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(
                f"{where}: {path}{old}: found both {old!r} (deprecated) and {new!r}; "
                f"expected only {new!r}"
            )
        warn_deprecated(f"{path}{old}", f"{path}{new}", removed_in, where=where, stacklevel=5)
        data = {(new if key == old else key): value for key, value in data.items()}
    return data


def agent_json_schema() -> dict[str, Any]:
    """The JSON Schema of agent.yaml, as published in ``agent.schema.json``."""
    schema = AgentConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_URL
    schema["title"] = "Toren agent.yaml"
    # Deprecated keys are still accepted: editors should not flag them as errors.
    for old, (new, removed_in) in DEPRECATED_KEYS.items():
        for target in (schema, schema["$defs"]["ProcessConfig"]):
            target["properties"][old] = {
                "deprecated": True,
                "description": f"Deprecated: use `{new}`. Removed in {removed_in}.",
            }
    return schema


def schema_path() -> Path:
    return Path(__file__).with_name("agent.schema.json")


def render_schema() -> str:
    """The exact text of the committed ``agent.schema.json``."""
    return json.dumps(agent_json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema(path: Path | None = None) -> Path:
    """Regenerate the committed ``agent.schema.json``::

    python -c "from toren.agents.config import write_schema; write_schema()"
    """
    target = path or schema_path()
    target.write_text(render_schema(), encoding="utf-8")
    return target
