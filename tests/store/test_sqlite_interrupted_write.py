"""SQLite's inline writes after an interrupt: the loop's connection must not keep a write
transaction that an interrupted write left open (it would hold the write lock for good)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toren.store.sqlite import SQLiteStore


class _InterruptedAfterBegin:
    """The loop's cursor, with a KeyboardInterrupt delivered just after BEGIN returned."""

    def __init__(self, cur: Any) -> None:
        self.cur, self.armed = cur, True

    def execute(self, sql: str, *args: Any) -> Any:
        result = self.cur.execute(sql, *args)
        if sql == "BEGIN IMMEDIATE" and self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cur, name)


async def test_a_write_interrupted_after_begin_does_not_wedge_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await store.migrate()
        await store._run(lambda cur: cur.execute("CREATE TABLE t (k INTEGER)"))
        assert store._loop_cur is not None
        store._loop_cur = _InterruptedAfterBegin(store._loop_cur)  # type: ignore[assignment]

        store._gate.turned()  # a lone write, inline
        with pytest.raises(KeyboardInterrupt):
            await store._run(lambda cur: cur.execute("INSERT INTO t (k) VALUES (1)"))

        store._gate.turned()
        await store._run(lambda cur: cur.execute("INSERT INTO t (k) VALUES (2)"))
        assert store._loop_conn is not None and not store._loop_conn.in_transaction
        rows = await store._run(lambda cur: cur.execute("SELECT k FROM t").fetchall(), write=False)
        assert rows == [(2,)]
    finally:
        await store.close()
