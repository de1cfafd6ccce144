"""Agents: agent.yaml, tools, the built-in loop, pricing and telemetry hooks.

An agent is a directory with ``agent.yaml`` (see ``docs/agent-yaml.md``), prompt files and
an optional ``tools.py``. :class:`DirectoryResolver` turns agent directories into the
:class:`~toren.core.agent_api.program.AgentProgram` objects the engine runs.
"""

from toren.agents.config import AgentConfig, TorenDeprecationWarning, agent_json_schema
from toren.agents.loader import AgentDefinition, ProcessDefinition, directory_hash, load_agent
from toren.agents.loop import LoopSpec, make_loop
from toren.agents.pricing import CostEstimate, Price, PriceTable, cost, estimate
from toren.agents.resolver import DirectoryResolver, ProviderFactory, default_provider_factory
from toren.agents.tools import tool_from_function, tools_from_module

__all__ = [
    "AgentConfig",
    "AgentDefinition",
    "CostEstimate",
    "DirectoryResolver",
    "LoopSpec",
    "Price",
    "PriceTable",
    "ProcessDefinition",
    "ProviderFactory",
    "TorenDeprecationWarning",
    "agent_json_schema",
    "cost",
    "default_provider_factory",
    "directory_hash",
    "estimate",
    "load_agent",
    "make_loop",
    "tool_from_function",
    "tools_from_module",
]
