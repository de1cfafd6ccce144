"""The suite's own order (tests/conftest.py): the tests marked ``slow`` come first, the
others keep their order. pytest-xdist hands tests out in this order, so the minute-long
ones start while the short ones are still to come."""

from __future__ import annotations

import pytest

from tests.conftest import pytest_collection_modifyitems


class Item:
    def __init__(self, name: str, slow: bool) -> None:
        self.name, self.slow = name, slow

    def get_closest_marker(self, name: str) -> object | None:
        return pytest.mark.slow if name == "slow" and self.slow else None


def test_slow_tests_first_the_others_in_their_order() -> None:
    items = [Item("a", False), Item("b", True), Item("c", False), Item("d", True)]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["b", "d", "a", "c"]


def test_this_session_started_with_the_slow_tests(request: pytest.FixtureRequest) -> None:
    """In the collection this run made: no slow test after a test that is not."""
    slow = [item.get_closest_marker("slow") is not None for item in request.session.items]
    assert slow == sorted(slow, reverse=True)
