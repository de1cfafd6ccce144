"""What the SQLite store hands its database thread, for the store tests."""

from __future__ import annotations

from typing import Any

from toren.store.sqlite import SQLiteStore


def count_thread_jobs(store: SQLiteStore) -> list[bool]:
    """Every job handed to the database thread from now on (True for a write)."""
    jobs: list[bool] = []
    submit = store._submit

    def counted(job: Any) -> None:
        jobs.append(job.write)
        submit(job)

    store._submit = counted  # type: ignore[method-assign]
    return jobs
