"""What can be known about an agent's providers before a run of it starts.

A model reference of agent.yaml whose provider has neither an API key nor a base URL
would fail the run's first model call, and every retry after it, until someone sets the
key: a run that sits blocked from its first second. So the places that start a run where
its worker runs, with the worker's environment (``toren run``, an API with an in-process
worker as under ``toren dev``), refuse it before anything is stored, like any other
configuration error. A key removed after the run started is the runtime's to report
(the run shows as blocked: RunRecord.blocked_dict in toren.core.contract.records).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from toren.agents.config import ProviderConfig, parse_model_ref
from toren.agents.loader import AgentDefinition
from toren.errors import MissingProviderKey

# The SDK's own variables: a provider without ``providers:`` settings reads these.
KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
# A local server needs no key.
BASE_URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "openai-responses": "OPENAI_BASE_URL"}
VENDORS = {"openai": "OpenAI", "openai-responses": "OpenAI", "anthropic": "Anthropic"}


def check_providers(definition: AgentDefinition, env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`MissingProviderKey` for the first model of the agent's processes
    whose provider could not be reached for want of a key."""
    env = os.environ if env is None else env
    for process in definition.processes.values():
        if not process.model:
            continue
        name = parse_model_ref(process.model)[0]
        problem = key_problem(definition, name, env)
        if problem is not None:
            raise MissingProviderKey(
                f"{problem} (model {process.model!r} of agent {definition.name!r}, "
                f"{definition.file})",
                agent=definition.name,
                provider=name,
                file=str(definition.file),
            )


def key_problem(definition: AgentDefinition, name: str, env: Mapping[str, str]) -> str | None:
    """Why provider ``name`` of the agent has no key, or None when it has one (or needs
    none: a base URL, a provider that is not a vendor's)."""
    kind = definition.provider_types.get(name, name)
    if kind not in KEY_VARIABLES:
        return None
    config = definition.config.providers.get(name) or ProviderConfig()
    if config.api_key_env:  # named in agent.yaml: read at the first call, required
        return (
            None
            if env.get(config.api_key_env)
            else missing_key_message(kind, name, config.api_key_env)
        )
    if env.get(KEY_VARIABLES[kind]):
        return None
    base_var = BASE_URL_VARIABLES.get(kind)
    if base_var is not None and (config.base_url or env.get(base_var)):
        return None  # a local server: the OpenAI SDK is given a placeholder key
    return missing_key_message(kind, name)


def missing_key_message(kind: str, name: str, api_key_env: str | None = None) -> str:
    """The one sentence every surface shows for a missing key: what is missing and the
    two ways agent.yaml and the environment accept to provide it."""
    vendor = VENDORS.get(kind, kind)
    if api_key_env:
        return (
            f"no {vendor} API key: the environment variable {api_key_env} named by "
            f"providers.{name}.api_key_env in agent.yaml is not set"
        )
    local = (
        f" (a local OpenAI-compatible server needs providers.{name}.base_url or "
        f"{BASE_URL_VARIABLES[kind]} instead)"
        if kind in BASE_URL_VARIABLES
        else ""
    )
    return (
        f"no {vendor} API key — set {KEY_VARIABLES[kind]} or `api_key_env` "
        f"(providers.{name}.api_key_env) in agent.yaml{local}"
    )
