"""A dated price table for common models, in Decimal USD per million tokens.

THESE ARE ESTIMATES. Vendors change prices, bill cached and batched tokens differently
and round in their own way; Toren's cost figures are for budgets and dashboards, not for
reconciling an invoice. The table says when it was last checked (:data:`PRICES_AS_OF`);
agent.yaml ``pricing:`` overrides or extends it per agent.

A model the table does not know costs ``0`` with ``known=False``, so a run never fails
because of a missing price, and the console can say "cost unknown" instead of "$0".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from toren.providers.base import Usage

__all__ = [
    "DEFAULT_PRICES",
    "PRICES_AS_OF",
    "CostEstimate",
    "Price",
    "PriceTable",
    "cost",
    "default_table",
    "estimate",
]

PRICES_AS_OF = "2025-11-30"
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    """USD per million input and output tokens."""

    input_per_mtok: Decimal
    output_per_mtok: Decimal

    def cost(self, usage: Usage) -> Decimal:
        return (
            Decimal(usage.input_tokens) * self.input_per_mtok
            + Decimal(usage.output_tokens) * self.output_per_mtok
        ) / _MILLION


def _p(inp: str, out: str) -> Price:
    return Price(Decimal(inp), Decimal(out))


# Standard (non-batch, uncached) list prices, checked on PRICES_AS_OF.
DEFAULT_PRICES: Mapping[str, Price] = {
    # OpenAI
    "openai:gpt-5": _p("1.25", "10.00"),
    "openai:gpt-5-mini": _p("0.25", "2.00"),
    "openai:gpt-5-nano": _p("0.05", "0.40"),
    "openai:gpt-4.1": _p("2.00", "8.00"),
    "openai:gpt-4.1-mini": _p("0.40", "1.60"),
    "openai:gpt-4.1-nano": _p("0.10", "0.40"),
    "openai:gpt-4o": _p("2.50", "10.00"),
    "openai:gpt-4o-mini": _p("0.15", "0.60"),
    "openai:o1": _p("15.00", "60.00"),
    "openai:o3": _p("2.00", "8.00"),
    "openai:o3-mini": _p("1.10", "4.40"),
    "openai:o4-mini": _p("1.10", "4.40"),
    "openai:gpt-4-turbo": _p("10.00", "30.00"),
    "openai:gpt-3.5-turbo": _p("0.50", "1.50"),
    # Anthropic
    "anthropic:claude-opus-4-5": _p("5.00", "25.00"),
    "anthropic:claude-opus-4-1": _p("15.00", "75.00"),
    "anthropic:claude-opus-4-0": _p("15.00", "75.00"),
    "anthropic:claude-sonnet-4-5": _p("3.00", "15.00"),
    "anthropic:claude-sonnet-4-0": _p("3.00", "15.00"),
    "anthropic:claude-haiku-4-5": _p("1.00", "5.00"),
    "anthropic:claude-3-7-sonnet": _p("3.00", "15.00"),
    "anthropic:claude-3-5-sonnet": _p("3.00", "15.00"),
    "anthropic:claude-3-5-haiku": _p("0.80", "4.00"),
    "anthropic:claude-3-opus": _p("15.00", "75.00"),
    "anthropic:claude-3-haiku": _p("0.25", "1.25"),
}

# Aliases vendors accept for the same model.
_ALIASES = {
    "anthropic:claude-opus-4": "anthropic:claude-opus-4-0",
    "anthropic:claude-sonnet-4": "anthropic:claude-sonnet-4-0",
}

# Providers billed at another's prices: the same models behind another API.
_SAME_PRICES = {"openai-responses": "openai"}

# Dated snapshots and "-latest" aliases are priced as their family:
# gpt-4o-mini-2024-07-18, claude-3-5-sonnet-20241022, claude-3-5-sonnet-latest.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")

# Providers that never bill.
_FREE_PROVIDERS = frozenset({"scripted"})


@dataclass(frozen=True)
class CostEstimate:
    usd: Decimal
    known: bool
    price: Price | None = None
    as_of: str = PRICES_AS_OF


@dataclass(frozen=True)
class PriceTable:
    """Model ref (``provider:model``) -> :class:`Price`. Immutable; ``with_overrides``
    returns a new table, so one agent's overrides never leak into another's."""

    prices: Mapping[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    as_of: str = PRICES_AS_OF

    def with_overrides(self, overrides: Mapping[str, Any]) -> PriceTable:
        """Add or replace prices. Values are :class:`Price` or objects/mappings with
        ``input_usd_per_mtok`` and ``output_usd_per_mtok`` (the agent.yaml shape)."""
        merged = dict(self.prices)
        for ref, value in overrides.items():
            merged[ref] = _to_price(value)
        return PriceTable(merged, self.as_of)

    def lookup(self, model_ref: str) -> Price | None:
        provider, _, model = model_ref.partition(":")
        if provider in _FREE_PROVIDERS:
            return Price(Decimal(0), Decimal(0))
        if provider in _SAME_PRICES and model_ref not in self.prices:
            return self.lookup(f"{_SAME_PRICES[provider]}:{model}")
        candidates = [model_ref, _ALIASES.get(model_ref, "")]
        family = _SNAPSHOT.sub("", model)
        if family != model:
            candidates += [f"{provider}:{family}", _ALIASES.get(f"{provider}:{family}", "")]
        for ref in candidates:
            if ref and ref in self.prices:
                return self.prices[ref]
        return None

    def estimate(self, model_ref: str, usage: Usage) -> CostEstimate:
        price = self.lookup(model_ref)
        if price is None:
            return CostEstimate(Decimal(0), known=False, as_of=self.as_of)
        return CostEstimate(price.cost(usage), known=True, price=price, as_of=self.as_of)

    def cost(self, model_ref: str, usage: Usage) -> Decimal:
        return self.estimate(model_ref, usage).usd


def _to_price(value: Any) -> Price:
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        inp, out = value["input_usd_per_mtok"], value["output_usd_per_mtok"]
    else:
        inp, out = value.input_usd_per_mtok, value.output_usd_per_mtok
    return Price(Decimal(str(inp)), Decimal(str(out)))


_DEFAULT = PriceTable()


def default_table() -> PriceTable:
    return _DEFAULT


def estimate(model_ref: str, usage: Usage, table: PriceTable | None = None) -> CostEstimate:
    """Cost of one call with ``known`` telling whether the model was in the table."""
    return (table or _DEFAULT).estimate(model_ref, usage)


def cost(model_ref: str, usage: Usage, table: PriceTable | None = None) -> Decimal:
    """Estimated USD cost of one call; ``Decimal(0)`` for a model the table lacks."""
    return (table or _DEFAULT).cost(model_ref, usage)
