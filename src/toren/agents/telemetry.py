"""Observability hooks: OpenTelemetry spans (GenAI semantic conventions) and JSON logs.

The engine calls a :class:`Telemetry` object's hooks; it never imports OpenTelemetry
itself. :func:`create_telemetry` returns :class:`OtelTelemetry` when the ``otel`` extra
is installed and :class:`NoopTelemetry` otherwise. Nothing here is a global: a runtime
holds its own telemetry object, and a ``tracer_provider`` can be passed explicitly (the
default is OpenTelemetry's own global provider, which is how OTel is configured).

Spans (every one carries ``toren.run_id``, ``toren.stream`` where it applies):

* ``invoke_agent {agent}`` around a tick: ``gen_ai.operation.name=invoke_agent``,
  ``gen_ai.agent.name``, ``toren.process``.
* ``chat {model}`` per model call: ``gen_ai.operation.name=chat``, ``gen_ai.system`` and
  ``gen_ai.provider.name`` (the older and newer spelling of the same attribute),
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``gen_ai.response.finish_reasons``, ``toren.position``,
  ``toren.replayed``, ``toren.cost_usd``.
* ``execute_tool {tool}`` per tool call: ``gen_ai.operation.name=execute_tool``,
  ``gen_ai.tool.name``, ``toren.position``, ``toren.replayed``.

Model and tool hooks are called after the step with its latency; the span is back-dated
to cover exactly that time. Replayed steps make no span unless ``trace_replayed``: replay
runs at the start of every tick, and a 200-step run would otherwise emit 200 spans per
tick that describe no work. A replayed call never reports token usage (nothing was used).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from toren.core.contract.ports import Telemetry
from toren.providers.base import ModelRequest, ModelResponse

__all__ = [
    "JsonLogFormatter",
    "NoopTelemetry",
    "OtelTelemetry",
    "Telemetry",
    "create_telemetry",
    "run_logger",
]


class NoopTelemetry:
    """Does nothing; used when the ``otel`` extra is not installed or tracing is off."""

    @contextlib.contextmanager
    def run_span(
        self, run_id: str, *, agent: str, process: str, code_version: str = ""
    ) -> Iterator[None]:
        yield

    def on_model_call(self, *args: object, **kwargs: object) -> None:
        return None

    def on_tool_call(self, *args: object, **kwargs: object) -> None:
        return None


class OtelTelemetry:
    """Spans through an OpenTelemetry tracer (``pip install 'toren-run[otel]'``)."""

    def __init__(self, tracer_provider: Any = None, *, trace_replayed: bool = False) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("toren", tracer_provider=tracer_provider)
        self.trace_replayed = trace_replayed

    @contextlib.contextmanager
    def run_span(
        self, run_id: str, *, agent: str, process: str, code_version: str = ""
    ) -> Iterator[None]:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "toren.run_id": run_id,
            "toren.process": process,
            "toren.code_version": code_version,
        }
        with self._tracer.start_as_current_span(
            f"invoke_agent {agent}", attributes=attributes, record_exception=True
        ):
            yield

    def on_model_call(
        self,
        run_id: str,
        stream: str,
        position: int,
        request: ModelRequest,
        response: ModelResponse | None,
        latency: float,
        replayed: bool,
        *,
        error: str | None = None,
        cost_usd: Decimal | None = None,
    ) -> None:
        if replayed and not self.trace_replayed:
            return
        attrs: dict[str, object] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": request.provider,
            "gen_ai.provider.name": request.provider,
            "gen_ai.request.model": request.model,
            **_request_params(request.params),
            **_step_attrs(run_id, stream, position, replayed),
        }
        if response is not None:
            attrs["gen_ai.response.model"] = response.model or request.model
            attrs["gen_ai.response.finish_reasons"] = [response.finish_reason]
            if not replayed:
                attrs["gen_ai.usage.input_tokens"] = response.usage.input_tokens
                attrs["gen_ai.usage.output_tokens"] = response.usage.output_tokens
        if cost_usd is not None and not replayed:
            attrs["toren.cost_usd"] = float(cost_usd)
        self._emit(f"chat {request.model}", attrs, latency, error)

    def on_tool_call(
        self,
        run_id: str,
        stream: str,
        position: int,
        name: str,
        latency: float,
        replayed: bool,
        *,
        error: str | None = None,
    ) -> None:
        if replayed and not self.trace_replayed:
            return
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            **_step_attrs(run_id, stream, position, replayed),
        }
        self._emit(f"execute_tool {name}", attrs, latency, error)

    def _emit(self, name: str, attrs: Mapping[str, Any], latency: float, error: str | None) -> None:
        try:
            end = time.time_ns()
            start = end - int(max(latency, 0.0) * 1e9)
            span = self._tracer.start_span(name, attributes=dict(attrs), start_time=start)
            if error is not None:
                span.set_attribute("error.type", error.split(":", 1)[0][:100])
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
            span.end(end_time=end)
        except Exception:  # telemetry must never break a run
            logging.getLogger("toren.telemetry").debug("span failed", exc_info=True)


_PARAM_ATTRS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
}


def _request_params(params: Mapping[str, object]) -> dict[str, object]:
    return {attr: params[key] for key, attr in _PARAM_ATTRS.items() if params.get(key) is not None}


def _step_attrs(run_id: str, stream: str, position: int, replayed: bool) -> dict[str, object]:
    return {
        "toren.run_id": run_id,
        "toren.stream": stream,
        "toren.position": position,
        "toren.replayed": replayed,
    }


def create_telemetry(
    *, enabled: bool | None = None, tracer_provider: object = None, trace_replayed: bool = False
) -> OtelTelemetry | NoopTelemetry:
    """OTel spans if the extra is installed (or ``enabled=True`` demands it), else no-op."""
    if enabled is False:
        return NoopTelemetry()
    try:
        return OtelTelemetry(tracer_provider, trace_replayed=trace_replayed)
    except ImportError:
        if enabled:
            raise ImportError(
                "OpenTelemetry tracing needs the 'otel' extra: pip install 'toren-run[otel]'"
            ) from None
        return NoopTelemetry()


# -- structured logs -------------------------------------------------------------------

_STANDARD_RECORD_KEYS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then ``run_id``,
    ``stream``, ``position`` and any other ``extra=`` fields, then ``exc`` if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_RECORD_KEYS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def run_logger(
    logger: logging.Logger | str, run_id: str, **fields: object
) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose every record carries ``run_id`` (and ``fields``) for the formatter."""
    base = logging.getLogger(logger) if isinstance(logger, str) else logger
    return _RunAdapter(base, {"run_id": run_id, **fields})


class _RunAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs
