from __future__ import annotations

from importlib.util import find_spec

import pytest

from toren.errors import AgentConfigError
from toren.providers.anthropic import AnthropicProvider
from toren.providers.base import ModelProvider
from toren.providers.openai import OpenAIProvider
from toren.providers.registry import available_providers, build_provider, parse_model_ref

from .fakes import FAKE_KEY


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("openai:gpt-4o-mini", ("openai", "gpt-4o-mini")),
        ("anthropic:claude-sonnet-4-5", ("anthropic", "claude-sonnet-4-5")),
        ("openai:llama3:8b", ("openai", "llama3:8b")),
    ],
)
def test_parse_model_ref(ref: str, expected: tuple[str, str]) -> None:
    assert parse_model_ref(ref) == expected


@pytest.mark.parametrize("ref", ["gpt-4o-mini", "openai:", ":gpt-4o", "", " openai:gpt-4o"])
def test_malformed_model_ref_says_what_was_found_and_what_is_expected(ref: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        parse_model_ref(ref)

    assert repr(ref) in str(caught.value)
    assert "'openai:gpt-4o-mini'" in str(caught.value)
    assert caught.value.details["ref"] == ref


async def test_build_openai_and_anthropic() -> None:
    built = [
        build_provider("openai", api_key=FAKE_KEY, base_url="http://127.0.0.1:9/v1"),
        build_provider("anthropic", api_key=FAKE_KEY, timeout=3.0),
    ]
    try:
        assert isinstance(built[0], OpenAIProvider)
        assert isinstance(built[1], AnthropicProvider)
        assert all(isinstance(p, ModelProvider) for p in built)
    finally:
        for provider in built:
            assert isinstance(provider, OpenAIProvider | AnthropicProvider)
            await provider.aclose()


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(AgentConfigError, match=r"unknown model provider 'opnai'.*'openai'"):
        build_provider("opnai")


def test_unknown_option_is_a_config_error() -> None:
    with pytest.raises(AgentConfigError, match=r"'openai'.*temprature.*it accepts: api_key"):
        build_provider("openai", api_key=FAKE_KEY, temprature=0.2)


def test_scripted_is_offered_only_when_installed() -> None:
    installed = find_spec("toren.providers.scripted") is not None
    assert ("scripted" in available_providers()) is installed
    assert available_providers()[:2] == ("openai", "anthropic")
