"""The pure parts of the retry loop: delays, Retry-After, redaction."""

from __future__ import annotations

import pytest

from toren.errors import ModelCallFailed
from toren.providers._retry import (
    Attempt,
    AttemptFailure,
    Retrying,
    SdkErrors,
    is_retryable_status,
    parse_retry_after,
)
from toren.providers.base import RetryPolicy
from toren.redact import Redactor

from .conftest import Draws


async def _no_sleep(seconds: float) -> None:
    pass


def retrying(policy: RetryPolicy) -> Retrying:
    """A retry loop whose jitter draws are always 0: full backoffs."""
    errors = SdkErrors(status=LookupError, connection=ConnectionError)
    return Retrying("test", errors, policy, 1.0, _no_sleep, rand=lambda: 0.0)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), (" 1.5 ", 1.5), ("-1", None), ("soon", None), (None, None), ("nan", None)],
)
def test_retry_after_seconds_form(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_retry_after_zero_falls_back_to_backoff() -> None:
    # "Retry now" would hammer a server that just refused: the SDKs back off instead.
    assert parse_retry_after("0") is None


def test_retry_after_http_date_form() -> None:
    now = 1445412470.0  # Wed, 21 Oct 2015 07:27:50 GMT
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now=now) is None  # past
    assert parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now=now) == 10.0  # RFC 850
    assert parse_retry_after("Wed Oct 21 07:28:00 2015", now=now) == 10.0  # asctime
    assert parse_retry_after("Wed, 32 Oct 2015 07:28:00 GMT", now=now) is None


def test_retry_after_with_a_year_past_any_calendar_is_unreadable() -> None:
    # email.utils hands the year to datetime as is: one past a C long overflowed (an
    # OverflowError out of the retry loop's except block) instead of falling back.
    assert parse_retry_after("Mon, 1 Jan 99999999999999999999 10:00:00 GMT") is None
    assert parse_retry_after("Mon, 1 Jan 99999 10:00:00 GMT") is None


@pytest.mark.parametrize(
    ("status", "retryable"), [(408, True), (409, True), (429, True), (500, True), (529, True)]
)
def test_retryable_statuses(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


@pytest.mark.parametrize("status", [400, 401, 403, 404, 418, 422])
def test_client_errors_are_final(status: int) -> None:
    assert not is_retryable_status(status)


def test_delay_is_exponential_and_capped() -> None:
    policy = RetryPolicy(max_attempts=8, initial_backoff=1.0, multiplier=3.0, max_backoff=10.0)
    failure = AttemptFailure("x", 500, True, "E")

    delays = [retrying(policy).delay(failure, n) for n in range(1, 5)]

    assert delays == [1.0, 3.0, 9.0, 10.0]


def test_backoff_jitter_takes_up_to_a_quarter_off() -> None:
    policy = RetryPolicy(initial_backoff=1.0, multiplier=2.0, max_backoff=3.0)

    assert [policy.backoff(n, 0.0) for n in range(3)] == [1.0, 2.0, 3.0]
    assert [policy.backoff(n, 0.5) for n in range(3)] == [0.875, 1.75, 2.625]
    assert RetryPolicy(jitter=0.0).backoff(1, 0.9) == 1.0


def test_the_jitter_is_drawn_from_random_by_default() -> None:
    policy = RetryPolicy(initial_backoff=1.0)
    errors = SdkErrors(status=LookupError, connection=ConnectionError)
    default = Retrying("test", errors, policy, 1.0, _no_sleep)
    failure = AttemptFailure("x", 500, True, "E")

    delays = {default.delay(failure, 1) for _ in range(200)}

    assert len(delays) > 1
    assert all(0.75 < d <= 1.0 for d in delays)


async def test_only_waits_draw_jitter() -> None:
    draws = Draws(0.5, 0.5)  # two waits between three attempts; a third draw would fail
    errors = SdkErrors(status=LookupError, connection=ConnectionError)
    r = Retrying("test", errors, RetryPolicy(max_attempts=3), 1.0, _no_sleep, rand=draws)

    async def refused(_: Attempt) -> None:
        raise ConnectionError("refused")

    with pytest.raises(ModelCallFailed, match="after 3 attempts"):
        await r.call("m", refused)
    assert draws.values == []


def test_a_huge_attempt_number_waits_max_backoff() -> None:
    policy = RetryPolicy(multiplier=3.0, max_backoff=9.0, jitter=0.0)

    assert policy.backoff(5000) == 9.0


def test_retry_after_wins_over_backoff_up_to_its_own_cap() -> None:
    r = retrying(RetryPolicy(max_backoff=5.0, max_retry_after=60.0))

    assert r.delay(AttemptFailure("x", 429, True, "E", retry_after=2.0), 3) == 2.0
    assert r.delay(AttemptFailure("x", 429, True, "E", retry_after=60.0), 1) == 60.0
    assert r.delay(AttemptFailure("x", 429, True, "E", retry_after=60.5), 1) is None


def test_redact_leaves_placeholder_keys_alone() -> None:
    assert Redactor(("sk-abcdefgh12",)).text("key sk-abcdefgh12 is bad") == "key [redacted] is bad"
    assert Redactor(("none",)).text("none of it") == "none of it"
