"""Database URLs in messages and logs never show a password."""

from __future__ import annotations

import pytest

from toren.errors import StorageError
from toren.store import open_store
from toren.store.urls import shown_url, without_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://toren:pw-1@db:5432/toren", "postgresql://toren@db:5432/toren"),
        ("postgresql://:pw-1@db/toren", "postgresql://db/toren"),
        (
            "postgresql://toren@db/toren?sslmode=require&password=pw-1",
            "postgresql://toren@db/toren?sslmode=require",
        ),
        ("postgresql://toren@db/toren", "postgresql://toren@db/toren"),
        ("sqlite:///var/lib/toren.db", "sqlite:///var/lib/toren.db"),
    ],
)
def test_shown_url_drops_the_password_only(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_without_secrets_takes_out_the_password_as_written_and_decoded() -> None:
    url = "postgresql://toren:p%40ss-word@db/toren?password=other-pw"
    text = 'bad token "p%40ss-word", user "toren" with p@ss-word and other-pw'
    assert without_secrets(text, url) == 'bad token "***", user "toren" with *** and ***'


def test_an_unsupported_url_is_named_without_its_password() -> None:
    with pytest.raises(StorageError) as info:
        open_store("mysql://toren:pw-secret@db/toren")
    assert "'mysql://toren@db/toren'" in info.value.message
    assert "pw-secret" not in info.value.message


def test_a_url_that_does_not_parse_still_loses_its_password() -> None:
    """libpq takes an unencoded '[' in a password, urlsplit does not; the driver's error
    quotes the whole URL."""
    url = "postgresql://u:pa[ss@db/toren?password=other-secret"
    message = without_secrets(f'invalid URI: "{url}"', url)
    assert "pa[ss" not in message and "other-secret" not in message
    assert "pa[ss" not in shown_url(url)
