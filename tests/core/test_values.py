"""Money and totals of ``toren.core.contract.values``: integer nano-USD inside, ``Decimal`` at the
edges, spelled as the log has always spelled them."""

from __future__ import annotations

import json
from decimal import Decimal

import orjson

from toren.core.agent_api.context import RunUsage
from toren.core.agent_api.program import Limits, raised
from toren.core.contract.jsontext import dumps
from toren.core.contract.values import (
    ZERO,
    InvalidationCause,
    RunStatus,
    StepKind,
    TickStatus,
    Totals,
    from_nano,
    to_nano,
)


def test_members_serialise_as_their_strings() -> None:
    for member in (RunStatus.FAILED, StepKind.MODEL, InvalidationCause.STREAM_ENDED):
        value = {"x": member}
        assert json.dumps(value) == json.dumps({"x": member.value})
        assert orjson.dumps(value) == orjson.dumps({"x": member.value})
        assert dumps(value) == dumps({"x": member.value})
        assert f"{member}" == str(member) == member.value
    assert TickStatus.BACKED_OFF == "backed_off"


def test_nano_round_trip() -> None:
    assert to_nano("0.000123") == 123_000
    assert to_nano(Decimal("1.5")) == 1_500_000_000
    assert to_nano(0.1) == 100_000_000  # the float as it is spelled, not its expansion
    assert from_nano(0) == Decimal("0")
    assert from_nano(1_500_000_000) == Decimal("1.5")
    assert from_nano(to_nano("0.000000001")) == Decimal("1E-9")


def test_totals_add() -> None:
    a = Totals(1, 2, 3, 4, 5, 6)
    assert a + ZERO == a
    assert a + a == Totals(2, 4, 6, 8, 10, 12)
    assert Totals(cost_nanousd=1_500_000_000).cost_usd == Decimal("1.5")


def test_run_usage_from_totals_keeps_its_spelling() -> None:
    """ctx.usage.cost_usd is ``nano / 10**9`` unnormalised, as the tick has always made
    it: agent code quotes it in failure messages that are recorded."""
    for nano in (0, 123, 10**10, 1_500_000_000):
        usage = RunUsage.from_totals(Totals(1, 2, nano, 0, 3))
        assert str(usage.cost_usd) == str(Decimal(nano) / Decimal(10**9))
        assert (usage.input_tokens, usage.output_tokens, usage.steps) == (1, 2, 3)


def test_limits_cost_is_a_decimal_spelled_as_given() -> None:
    assert Limits(max_cost_usd=0.1).max_cost_usd == Decimal("0.1")
    assert str(Limits(max_cost_usd=1.0).max_cost_usd) == "1.0"  # as f"{1.0}" printed it
    assert str(Limits(max_cost_usd=2).max_cost_usd) == "2"  # as f"{2}" printed it
    assert Limits(max_cost_usd=Decimal("0.25")).max_cost_usd == Decimal("0.25")
    assert Limits().max_cost_usd is None


def test_raised_compares_and_keeps_decimals() -> None:
    limits = Limits(max_steps=5, max_cost_usd=0.1)
    # Earlier releases recorded a retry's raises as JSON numbers (floats, USD); this one
    # records integers (max_cost_nanousd). Both are read.
    up = raised(limits, {"max_steps": 8, "max_cost_usd": 0.3})
    assert (up.max_steps, up.max_cost_usd) == (8, Decimal("0.3"))
    assert str(up.max_cost_usd) == "0.3"
    assert raised(limits, {"max_steps": 2, "max_cost_usd": 0.1}) is limits  # never lowered
    assert raised(Limits(), {"max_steps": 9, "max_cost_usd": 1.0}) == Limits()  # unset stays
    up = raised(limits, {"max_steps": 8, "max_cost_nanousd": 300_000_000})
    assert (up.max_steps, str(up.max_cost_usd)) == (8, "0.3")
