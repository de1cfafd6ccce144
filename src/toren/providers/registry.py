"""Provider names, model references and construction.

A model reference is ``"<provider>:<model>"``, e.g. ``"openai:gpt-4o-mini"``. Only the first
colon separates: model names may contain colons themselves (``"openai:llama3:8b"`` on an
OpenAI-compatible Ollama). Vendor SDKs are imported only when their provider is built,
so ``toren --help`` does not pay for them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from toren.errors import AgentConfigError, ProviderUnavailable
from toren.providers.base import ModelProvider

# name -> (module, class). "scripted" may be absent from an installation; it is then
# simply not offered.
_PROVIDERS: dict[str, tuple[str, str]] = {
    "openai": ("toren.providers.openai", "OpenAIProvider"),
    "anthropic": ("toren.providers.anthropic", "AnthropicProvider"),
    "openai-responses": ("toren.providers.openai_responses", "OpenAIResponsesProvider"),
    "scripted": ("toren.providers.scripted", "ScriptedProvider"),
}

_EXAMPLE = "'openai:gpt-4o-mini'"


def parse_model_ref(ref: str) -> tuple[str, str]:
    """Split ``"provider:model"``; raise :class:`AgentConfigError` for anything else."""
    provider, sep, model = ref.partition(":")
    if not sep or not provider.strip() or not model.strip():
        raise AgentConfigError(
            f"malformed model reference {ref!r}: expected '<provider>:<model>', "
            f"e.g. {_EXAMPLE} (providers: {', '.join(available_providers())})",
            ref=ref,
        )
    if provider != provider.strip() or model != model.strip():
        raise AgentConfigError(
            f"malformed model reference {ref!r}: remove the spaces around "
            f"provider {provider!r} and model {model!r}, e.g. {_EXAMPLE}",
            ref=ref,
        )
    return provider, model


def available_providers() -> tuple[str, ...]:
    """Provider names offered here (``scripted`` only where its module is installed).
    Cheap: finds modules without importing them or their vendor SDKs."""
    return tuple(name for name, (module, _) in _PROVIDERS.items() if find_spec(module) is not None)


def build_provider(name: str, **config: Any) -> ModelProvider:
    """Build the provider called ``name`` with its own keyword ``config``."""
    if name not in available_providers():
        raise AgentConfigError(
            f"unknown model provider {name!r}: expected one of "
            f"{', '.join(map(repr, available_providers()))}",
            provider=name,
        )
    factory = _factory(name)
    _check_config(name, factory, config)
    provider: ModelProvider = factory(**config)
    return provider


def _factory(name: str) -> Callable[..., ModelProvider]:
    module_name, class_name = _PROVIDERS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The toren module exists (available_providers said so); its vendor SDK does not.
        raise ProviderUnavailable(
            f"the {name!r} provider needs the {exc.name!r} package: pip install {exc.name}",
            provider=name,
        ) from exc
    factory: Callable[..., ModelProvider] = getattr(module, class_name)
    return factory


def _check_config(name: str, factory: Callable[..., ModelProvider], config: dict[str, Any]) -> None:
    # Checked before calling, so a TypeError raised inside a constructor is not mistaken
    # for a bad option.
    try:
        inspect.signature(factory).bind(**config)
    except TypeError as exc:
        accepted = ", ".join(inspect.signature(factory).parameters)
        raise AgentConfigError(
            f"bad configuration for model provider {name!r}: {exc}; it accepts: {accepted}",
            provider=name,
        ) from None
