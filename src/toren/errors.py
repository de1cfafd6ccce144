"""Toren's exceptions, one tree under :class:`TorenError`.

    TorenError
    ├── UserError                  the caller or agent author must fix something
    │   ├── AgentConfigError       a bad agent.yaml, tools.py or script file
    │   │   └── MissingProviderKey     a model's provider has no API key (nor base URL)
    │   ├── AgentNotFound          no agent (or process) by that name
    │   ├── InvalidInput           a run input, message or argument of the wrong shape
    │   │   └── ForkPointNotFound      a fork at a step the source run does not have
    │   ├── IdempotencyConflict    an idempotency key reused with different arguments
    │   ├── ConcurrencyConflict    a start refused: its concurrency key has an unfinished run
    │   ├── RunNotFound            no run with that id
    │   ├── ScheduleNotFound       no schedule with that id
    │   └── RunNotRetryable        a retry of a run that is not failed (cancelled, ...)
    ├── StepFailed                 a recorded step ended in an error; replay re-raises it
    │   ├── ModelCallFailed        the provider refused or failed after retries
    │   └── ToolFailed             the tool raised
    ├── LimitExceeded              a run hit max_steps, max_cost or a step timeout
    └── InfrastructureError        the runtime or its storage failed, not the user
        ├── StorageError           the database is unreachable or failed a statement
        │   ├── CorruptRow         a stored row (run, inbox message) that cannot be read
        │   │   └── CorruptEventLog    an event row, or a message body it references
        │   └── SchemaError        DDL that cannot be applied
        ├── LeaseLost              another worker owns the run now; stop writing
        ├── MessageConsumed        a step's message was consumed by another writer first;
        │                          the lease still holds (take the next message)
        └── ProviderUnavailable    a provider could not be constructed (missing key, SDK)

    RunCancelledSignal (BaseException)  delivered into agent code on cancellation;
                                        derives from BaseException so that an agent's
                                        ``except Exception`` cannot swallow it.

Messages name the run, stream, step and file involved, quote identifiers with ``!r``
and say what to do next.
"""

from __future__ import annotations

from typing import Any


class TorenError(Exception):
    """Root of every error Toren raises on purpose."""

    code = "toren_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class UserError(TorenError):
    code = "user_error"


class AgentConfigError(UserError):
    code = "agent_config_invalid"


class MissingProviderKey(AgentConfigError):
    """Known when the agent loads: a run of it would block on its first model call."""

    code = "provider_key_missing"


class AgentNotFound(UserError):
    code = "agent_not_found"


class InvalidInput(UserError):
    code = "invalid_input"


class ForkPointNotFound(InvalidInput):
    """A fork point (``STREAM:POSITION``) the source run does not have: a stream it never
    had (or that an invalidation superseded), or a position past the stream's end. The
    request was well formed; the run's log says no (HTTP 409)."""

    code = "fork_point_not_found"


class IdempotencyConflict(UserError):
    code = "idempotency_conflict"


class RunNotFound(UserError):
    code = "run_not_found"


class ConcurrencyConflict(UserError):
    """A start refused by its agent's ``concurrency.on_conflict: reject``: a run of the same
    key is unfinished (``runs`` names them)."""

    code = "concurrency_conflict"

    def __init__(self, message: str, *, runs: list[str] | None = None) -> None:
        super().__init__(message, runs=list(runs or []))
        self.runs = list(runs or [])


class ScheduleNotFound(UserError):
    code = "schedule_not_found"


class RunNotRetryable(UserError):
    """Only a failed run can be retried: a cancelled run is final, a completed one has
    nothing to retry (fork those), a queued, running or waiting one is still going."""

    code = "run_not_retryable"


class StepFailed(TorenError):
    """A step that ended in an error. The error is recorded, so replay raises it again."""

    code = "step_failed"


class ModelCallFailed(StepFailed):
    code = "model_call_failed"


class ToolFailed(StepFailed):
    code = "tool_failed"


class LimitExceeded(TorenError):
    code = "limit_exceeded"


class InfrastructureError(TorenError):
    code = "infrastructure_error"


class StorageError(InfrastructureError):
    code = "storage_error"


class CorruptRow(StorageError):
    """Stored data that cannot be read. Never skipped and never blamed on the agent: the
    run is left as it is (its lease runs out) until the row is repaired."""

    code = "corrupt_row"


class CorruptEventLog(CorruptRow):
    code = "corrupt_event_log"


class SchemaError(StorageError):
    code = "schema_error"


class LeaseLost(InfrastructureError):
    code = "lease_lost"


class MessageConsumed(InfrastructureError):
    """A step that takes a message was refused, and wrote nothing, because the message is
    no longer an unconsumed message of the run (another writer consumed it first, or it
    is another run's). Not a lost lease: the store checks the lease first and raises
    :class:`LeaseLost` when that failed; this worker still holds the run, and the step
    takes the next message instead."""

    code = "message_consumed"

    def __init__(self, message: str, *, message_id: int, **details: Any) -> None:
        super().__init__(message, message_id=message_id, **details)
        self.message_id = message_id


class ProviderUnavailable(InfrastructureError):
    code = "provider_unavailable"


class RunCancelledSignal(BaseException):
    """Raised inside agent code when its run is cancelled. Not an ``Exception``."""
