"""The dated price table: Decimal costs, snapshots, overrides, unknown models."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from toren.agents import load_agent
from toren.agents.pricing import (
    DEFAULT_PRICES,
    PRICES_AS_OF,
    Price,
    PriceTable,
    cost,
    estimate,
)
from toren.providers.base import Usage


def test_known_model_cost_is_exact_decimal() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000)
    assert cost("openai:gpt-4o-mini", usage) == Decimal("0.45")
    assert cost("anthropic:claude-sonnet-4-5", Usage(1000, 1000)) == Decimal("0.018")
    assert isinstance(cost("openai:gpt-4o", Usage(1, 1)), Decimal)


def test_dated_snapshots_and_latest_aliases_use_the_family_price() -> None:
    base = estimate("openai:gpt-4o-mini", Usage(1000, 0))
    assert estimate("openai:gpt-4o-mini-2024-07-18", Usage(1000, 0)) == base
    sonnet = estimate("anthropic:claude-3-5-sonnet-20241022", Usage(1000, 0))
    assert sonnet.known and sonnet.price == DEFAULT_PRICES["anthropic:claude-3-5-sonnet"]
    assert estimate("anthropic:claude-3-5-haiku-latest", Usage(1, 1)).known
    assert estimate("anthropic:claude-sonnet-4-20250514", Usage(1, 1)).known


def test_unknown_model_costs_zero_and_says_so() -> None:
    result = estimate("openai:gpt-99", Usage(1000, 1000))
    assert result.usd == Decimal(0) and result.known is False and result.price is None
    assert estimate("ollama:llama3", Usage(10, 10)).known is False


def test_scripted_is_free_and_known() -> None:
    result = estimate("scripted:script.yaml", Usage(1000, 1000))
    assert result.usd == 0 and result.known is True


def test_table_is_dated_and_labelled() -> None:
    assert PriceTable().as_of == PRICES_AS_OF
    import toren.agents.pricing as module

    assert "ESTIMATES" in (module.__doc__ or "")


def test_overrides_extend_and_replace_without_mutating_the_default() -> None:
    table = PriceTable().with_overrides(
        {
            "openai:gpt-4o-mini": {"input_usd_per_mtok": "1", "output_usd_per_mtok": "2"},
            "ollama:llama3": Price(Decimal("0.01"), Decimal("0.02")),
        }
    )
    assert table.cost("openai:gpt-4o-mini", Usage(1_000_000, 1_000_000)) == Decimal(3)
    assert table.estimate("ollama:llama3", Usage(1_000_000, 0)).usd == Decimal("0.01")
    assert cost("openai:gpt-4o-mini", Usage(1_000_000, 0)) == Decimal("0.15")


def test_agent_yaml_pricing_overrides(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text(
        "name: a\nmodel: openai:gpt-4o-mini\npricing:\n"
        "  'openai:gpt-4o-mini': {input_usd_per_mtok: 0.2, output_usd_per_mtok: 0.8}\n"
        "  'openai:ft:custom': {input_usd_per_mtok: 3, output_usd_per_mtok: 12}\n"
    )
    prices = load_agent(tmp_path).prices
    assert prices.cost("openai:gpt-4o-mini", Usage(1_000_000, 1_000_000)) == Decimal("1.0")
    assert prices.estimate("openai:ft:custom", Usage(0, 1_000_000)).usd == Decimal(12)
