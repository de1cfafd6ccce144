"""The HTTP API: ``create_app(store, agents, ...)`` returns a FastAPI application.

Routes live under ``/v1`` (plus ``/metrics``); docs/http-api.md is the reference. Every
route but ``/v1/health`` needs a token when tokens are configured. Errors are always
``{"error": {"code", "message"}}`` (see :mod:`toren.api.errors`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, TypeVar, cast

from fastapi import FastAPI, Header, Query, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import TypeAdapter

import toren
from toren.api import flow, metrics, models, render, schedules
from toren.api.errors import ApiError, RelativePaths, install
from toren.api.hosts import ANY_HOST, LOOPBACK_HOSTS, HostGuard
from toren.api.middleware import Auth, BodyLimit, CatchAll, NoSniff
from toren.api.routing import Methods
from toren.api.search import SearchIndexer, indexing
from toren.api.sse import RunStream, StreamSettings, resume_problem
from toren.api.state import ApiState, InProcessWorker, State, error_responses
from toren.core.agent_api.program import AgentResolver
from toren.core.contract.changes import explain_invalidations
from toren.core.contract.events import StreamInvalidated
from toren.core.contract.ratelimit import reason as rate_reason
from toren.core.contract.recorded import load_blobs
from toren.core.contract.values import RunStatus
from toren.core.drivers.fixforward import fork_run as core_fork_run
from toren.core.drivers.fixforward import retry_run as core_retry_run
from toren.core.drivers.live import LiveHub
from toren.core.drivers.plan import PLAN_LIMIT, plan_report
from toren.core.drivers.runs import MAX_RUNS_PAGE, unexpected_message
from toren.core.drivers.runs import send_message as core_send_message
from toren.core.drivers.runs import start as core_start
from toren.core.drivers.verify import verify_run as verify_run_report
from toren.errors import TorenError
from toren.redact import Redactor, secrets_from_env
from toren.store.base import RunRecord, Store

log = logging.getLogger("toren.api")
F = TypeVar("F", bound=Callable[..., object])

# Run ids the store hands out are ``run_<hex>``; anything far from that is not a run, and
# is answered without a query (a NUL byte would even make PostgreSQL fail the query).
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def create_app(
    store: Store,
    agents: AgentResolver,
    *,
    tokens: Sequence[str] = (),
    live: LiveHub | None = None,
    runtime: InProcessWorker | None = None,
    console: bool = True,
    max_body_bytes: int = 1_000_000,
    heartbeat: float = 15.0,
    poll_interval: float | None = None,
    secrets: Sequence[str] = (),
    allowed_hosts: Sequence[str] | None = None,
    search_interval: float = 1.0,
) -> FastAPI:
    """The API over ``store`` for the agents ``agents`` resolves.

    ``tokens``: accepted API tokens (several, for rotation); empty turns auth off, which
    :func:`toren.api.server.check_bind` only allows on a loopback address. ``live``: the
    worker's live feed, for prompt streams and token deltas (without it, streams poll
    the store). ``runtime``: an in-process worker, told about cancellations at once.
    ``secrets``: extra strings never to appear in a response (credential-like environment
    variables are always redacted). ``heartbeat`` and ``poll_interval`` tune SSE streams.
    ``allowed_hosts``: the ``Host`` names served (:mod:`toren.api.hosts`; ``"*"`` for any).
    Default: the loopback names without tokens, any host with them. ``search_interval``:
    how often the search indexer (:mod:`toren.api.search`) looks for changed runs while
    the app is served.
    """
    from toren.api.server import check_tokens

    check_tokens(tokens)
    state = ApiState(
        store=store,
        agents=agents,
        live=live,
        runtime=runtime,
        redact=Redactor([*secrets, *tokens, *secrets_from_env(os.environ)]),
        paths=RelativePaths(getattr(agents, "roots", ())),
        stream=StreamSettings(
            heartbeat=heartbeat,
            poll_interval=poll_interval or (1.0 if live is not None else 0.25),
        ),
    )
    indexer = SearchIndexer(store, state.redact, interval=search_interval)
    app = FastAPI(
        lifespan=lambda _app: indexing(indexer),
        title="Toren",
        version=toren.__version__,
        description="The Toren HTTP API (v1): start, inspect, stream, message and cancel "
        "durable agent runs. Reference: docs/http-api.md.",
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.toren = state
    app.state.search_indexer = indexer
    app.state.tokens = tuple(tokens)
    install(app, state.redact, state.paths)
    for path, endpoint, options in [*_ROUTES, *schedules.ROUTES, *flow.ROUTES]:
        app.add_api_route(path, endpoint, **options)
    app.add_api_route(
        "/metrics",
        get_metrics,
        methods=["GET"],
        response_class=PlainTextResponse,
        responses={200: {"content": {metrics.CONTENT_TYPE: {"schema": {"type": "string"}}}}},
        tags=["operations"],
        summary="Prometheus metrics",
    )
    if allowed_hosts is None:
        allowed_hosts = (ANY_HOST,) if any(tokens) else LOOPBACK_HOSTS
    app.router.redirect_slashes = False  # Methods redirects, without trusting Host
    # Outermost last: NoSniff, CatchAll, the Host guard, auth, methods, the body limit.
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(Methods, routes=lambda: app.router.routes)
    app.add_middleware(Auth, tokens=list(tokens), is_public=state.is_public)
    app.add_middleware(HostGuard, allowed=allowed_hosts)
    app.add_middleware(CatchAll)
    app.add_middleware(NoSniff)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    if console:
        _mount_console(app, state)
    return app


def _mount_console(app: FastAPI, state: ApiState) -> None:
    """The web console (``toren.console``) mounts itself when it is installed."""
    try:
        from toren.console import mount  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return
    mount(app, state)


def _openapi(app: FastAPI) -> dict[str, object]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
        schema["security"] = [{"bearer": []}, {"apiKey": []}]
        schema["paths"]["/v1/health"]["get"]["security"] = []
        _drop_null_parameters(schema)
        _add_stream_schemas(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def _sse_message(event: str, data: str, with_id: bool = False) -> dict[str, object]:
    """One SSE message as schemathesis (and OpenAPI 3.1's reading of an event stream's
    ``schema``) sees it: ``{event, id?, data}``, ``data`` being JSON of ``data``'s schema."""
    properties: dict[str, object] = {
        "event": {"const": event},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{data}"},
        },
    }
    if with_id:
        properties["id"] = {"type": "string", "pattern": "^[0-9]+$"}
    required = ["event", "data", *(["id"] if with_id else [])]
    return {"type": "object", "required": required, "properties": properties}


def _add_stream_schemas(schema: dict[str, Any]) -> None:
    """``GET /v1/runs/{run_id}/stream`` documents each of its messages: an ``event`` (the
    log's Event, id = seq), a ``delta``, a ``replayed`` step, the ``end`` and an ``error``."""
    components = schema["components"]["schemas"]
    for model in (models.StreamDelta, models.StreamReplayed, models.StreamEnd):
        found = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in found.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components[model.__name__] = found
    media = schema["paths"]["/v1/runs/{run_id}/stream"]["get"]["responses"]["200"]["content"]
    media["text/event-stream"] = {
        "schema": {
            "oneOf": [
                _sse_message("event", "Event", with_id=True),
                _sse_message("delta", "StreamDelta"),
                _sse_message("replayed", "StreamReplayed"),
                _sse_message("end", "StreamEnd"),
                _sse_message("error", "ErrorBody"),
            ]
        }
    }


def _drop_null_parameters(schema: dict[str, Any]) -> None:
    """An optional query or header parameter is absent, never null (a query string or a
    header cannot carry a JSON null): ``anyOf: [X, null]`` becomes ``X``."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            for param in operation.get("parameters", ()):
                branches = param.get("schema", {}).get("anyOf")
                if branches and {"type": "null"} in branches:
                    rest = [b for b in branches if b != {"type": "null"}]
                    if len(rest) == 1:
                        extra = {k: v for k, v in param["schema"].items() if k != "anyOf"}
                        param["schema"] = {**rest[0], **extra}


# -- plumbing -----------------------------------------------------------------------------


_errors = error_responses


async def _run_or_404(state: ApiState, run_id: str) -> RunRecord:
    run = await state.store.get_run(run_id) if _RUN_ID.match(run_id) else None
    if run is None:
        raise ApiError(404, "run_not_found", f"no run with id {run_id!r}")
    return run


def _run(state: ApiState, run: RunRecord) -> dict[str, object]:
    return cast(dict[str, object], state.redact(run.to_dict()))


_ROUTES: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []


def _route(method: str, path: str, **options: object) -> Callable[[F], F]:
    """Collect a ``/v1`` route; ``create_app`` adds them all to each app it builds (so
    ``app.routes`` lists every route, and two apps in one process share nothing)."""

    def collect(fn: F) -> F:
        _ROUTES.append(("/v1" + path, fn, {"methods": [method], **options}))
        return fn

    return collect


# -- runs ---------------------------------------------------------------------------------


@_route(
    "POST",
    "/runs",
    status_code=201,
    response_model=models.Run,
    tags=["runs"],
    summary="Start a run",
    responses={
        200: {"model": models.Run, "description": "The idempotency key named an existing run"},
        **_errors(404, 409, 415, 422),
    },
)
async def start_run(
    body: models.StartRunRequest,
    response: Response,
    state: State,
    idempotency_key_header: Annotated[
        str | None, Header(alias="Idempotency-Key", pattern=models.KEY_PATTERN)
    ] = None,
) -> dict[str, object]:
    key = body.idempotency_key
    if body.idempotencyKey is not None:
        key = _deprecated_key(response, key, body.idempotencyKey)
    if idempotency_key_header is not None:
        if key is not None and key != idempotency_key_header:
            raise ApiError(
                409,
                "idempotency_conflict",
                f"the Idempotency-Key header ({idempotency_key_header!r}) and the body's "
                f"idempotency_key ({key!r}) differ; send one of them",
            )
        key = idempotency_key_header
    check_ready = getattr(state.agents, "check_ready", None)
    if state.runtime is not None and check_ready is not None:
        # Runs execute in this process (toren dev): a provider with no key here would
        # block the run from its first model call; refuse it like a config error.
        check_ready(body.agent)
    started = await core_start(
        state.store,
        state.agents,
        body.agent,
        body.input,
        process=body.process,
        idempotency_key=key,
        concurrency_key=body.concurrency_key,
        concurrency_limit=body.concurrency_limit,
        priority=body.priority,
    )
    run = started.run
    if not started.created:
        response.status_code = 200
    elif state.live is not None:
        state.live.publish(run.id, {"type": "created", "agent": run.agent})
    return _run(state, run)


def _deprecated_key(response: Response, key: str | None, old: str) -> str:
    """``idempotencyKey`` still works for one more minor, and says so."""
    from toren.deprecations import HTTP_FIELDS, message

    if key is not None and key != old:
        raise ApiError(
            409,
            "idempotency_conflict",
            f"idempotency_key ({key!r}) and its deprecated spelling idempotencyKey ({old!r}) "
            "differ; send idempotency_key only",
        )
    text = message("POST /v1/runs idempotencyKey", HTTP_FIELDS)
    response.headers["Deprecation"] = "true"
    response.headers["Warning"] = f'299 - "{text}"'
    log.warning("deprecated HTTP field used: %s", text)
    return old


@_route(
    "GET",
    "/runs",
    response_model=models.RunList,
    tags=["runs"],
    summary="List runs, newest first",
    description="Inputs, outputs and errors whose JSON text is larger than 4096 bytes are "
    "left out (null, with `input_summary` / `output_summary` / `error_summary` giving their "
    "size and first 256 characters); `GET /v1/runs/{run_id}` has them whole. A page is "
    "therefore at most about `limit` × 14 KB. The response carries an `ETag`; sent back "
    "in `If-None-Match`, an unchanged page is `304 Not Modified` without a body.",
    responses={
        304: {"description": "The page is unchanged since the `ETag` sent in `If-None-Match`."},
        **_errors(422),
    },
)
async def list_runs(
    state: State,
    status: RunStatus | None = None,
    agent: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    process: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_RUNS_PAGE), models.ASCII_INT] = 50,
    cursor: Annotated[
        str | None,
        Query(
            pattern=models.CURSOR_PATTERN,
            description="The `next_cursor` of the previous page (a run id, `run_` and 22 "
            "lowercase hex digits): older runs.",
        ),
    ] = None,
    search: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=r"^[^\x00-\x1f\x7f]*$",
            description="Only runs found by this search (docs/http-api.md#search): words "
            '(all must appear), "quoted phrases", a trailing `*` for a prefix; '
            "case-insensitive, over each run's redacted search text (agent, input, output, "
            "error; at most 32 KiB per run). No control characters.",
        ),
    ] = None,
    updated_after: Annotated[
        float | None,
        Query(
            ge=0,
            allow_inf_nan=False,
            description="Only runs whose `updated_at` is later (Unix seconds): what changed "
            "since a previous poll (pass the largest `updated_at` it returned).",
        ),
    ] = None,
    if_none_match: Annotated[
        str | None,
        Header(
            alias="If-None-Match",
            max_length=2000,
            description="The `ETag` of a page this client has: `304` if it is unchanged.",
        ),
    ] = None,
) -> object:
    runs = await state.store.list_runs(
        status=status,
        agent=agent,
        process=process,
        limit=limit,
        before=cursor,
        search=search,
        summary=True,
        updated_after=updated_after,
    )
    next_cursor = runs[-1].id if len(runs) == limit else None
    runs = [_safe_previews(state.safe_preview, r) for r in runs]
    found = state.pages.page(runs, next_cursor, state.redact)
    if found is not None:
        body, tag = found
    else:  # a value to redact or too deep: validated and serialised by pydantic
        page = models.RunList.model_validate(
            {"runs": [_run(state, r) for r in runs], "next_cursor": next_cursor}
        )
        body = page.model_dump_json().encode()
        tag = render.etag(body)
    headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
    if render.not_modified(if_none_match, tag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _safe_previews(safe: Callable[[str], str], run: RunRecord) -> RunRecord:
    """``run`` with the previews of its summaries redacted before anything renders them:
    a preview is cut from the stored text, and a secret the cut splits would not be
    recognised later. The same record when no preview changes (the rendered-page memo
    keys on it)."""
    if not run.summaries:
        return run
    shown = {k: safe(v.preview) for k, v in run.summaries.items()}
    if all(shown[k] == v.preview for k, v in run.summaries.items()):
        return run
    summaries = {k: dataclasses.replace(v, preview=shown[k]) for k, v in run.summaries.items()}
    return dataclasses.replace(run, summaries=summaries)


@_route(
    "GET",
    "/runs/{run_id}",
    response_model=models.Run,
    tags=["runs"],
    summary="Get a run",
    responses=_errors(404),
)
async def get_run(run_id: str, state: State) -> dict[str, Any]:
    run = await _run_or_404(state, run_id)
    shown = _run(state, run)
    queued = await state.store.queued_because(run)
    if queued is not None:
        shown["queue"] = state.redact(queued.to_dict())
    if run.status == RunStatus.WAITING and run.paced:
        shown["rate_limit"] = {
            "key": run.paced,
            "next_slot_at": run.not_before,
            "reason": rate_reason(run.paced, run.not_before, time.time()),
        }
    return shown


@_route(
    "GET",
    "/runs/{run_id}/events",
    response_model=models.EventList,
    tags=["events"],
    summary="Read a run's event log",
    description="At most `limit` events, and no more than 8 MiB of them (a page always "
    "holds at least one event): a page cut short by either has `next_after` set.",
    responses=_errors(404, 422),
)
async def list_events(
    run_id: str,
    state: State,
    after: Annotated[
        int,
        Query(ge=0, le=models.MAX_SEQ, description="Only events with a larger seq."),
        models.ASCII_INT,
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000), models.ASCII_INT] = 100,
) -> StreamingResponse:
    await _run_or_404(state, run_id)
    # The first chunk is read before the response starts, so that a failing read (a
    # corrupt row, the database gone) is still an error response with its status code.
    want = min(_EVENT_CHUNK_FIRST, limit)
    first = await state.store.load_events(run_id, after_seq=after, limit=want)
    body = _event_page(state, run_id, after, limit, first, want)
    return StreamingResponse(body, media_type="application/json")


# A page of events stops growing past this many bytes of JSON (it always holds at least
# one event), whatever ``limit`` says; the next page starts where it stopped.
MAX_EVENTS_PAGE_BYTES = 8 * 1024 * 1024
# The page is streamed: events are read from the store in chunks that start small and
# grow (up to _EVENT_CHUNK events) while a chunk stays under _EVENT_CHUNK_BYTES, so the
# server holds about that much of a page at a time (at least one event), not the page.
_EVENT_CHUNK_FIRST = 4
_EVENT_CHUNK = 100
_EVENT_CHUNK_BYTES = 1024 * 1024
_EVENT_MODEL: TypeAdapter[models.Event] = TypeAdapter(models.Event)


async def _event_page(
    state: ApiState, run_id: str, after: int, limit: int, chunk: list[Any], want: int
) -> AsyncIterator[bytes]:
    """The ``EventList`` body of up to ``limit`` redacted events after ``after`` within the
    byte budget, piece by piece: the same bytes the model serialised whole before (each
    event validated and serialised by it, joined as it joins a list). ``next_after`` is
    set when more may follow (a full page, or one cut by the budget). Each event is
    rendered by ``render.event_fragment`` when it can vouch for it (the same bytes)."""
    count, size, last, more = 0, 0, 0, False
    parts: list[bytes] = [b'{"events":[']
    while True:
        took = 0
        for event in chunk:
            part = render.event_fragment(event, state.redact) or _EVENT_MODEL.dump_json(
                _EVENT_MODEL.validate_python(state.redact(event.to_dict()))
            )
            size += len(part)
            if count and size > MAX_EVENTS_PAGE_BYTES:
                more = True
                break
            parts.append(b"," + part if count else part)
            count, last, took = count + 1, event.seq, took + len(part)
            del part
        else:
            if len(chunk) < want:
                break  # the log ends here
            if count >= limit:
                more = True
                break
            # One body message per chunk read (a chunk is at most about
            # _EVENT_CHUNK_BYTES), not one per event.
            yield b"".join(parts)
            parts.clear()
            after = chunk[-1].seq
            per_event = max(1, took // max(1, len(chunk)))
            fits = max(1, _EVENT_CHUNK_BYTES // per_event)
            want = min(want * 2, fits, _EVENT_CHUNK, limit - count)
            del chunk
            try:
                chunk = await state.store.load_events(run_id, after_seq=after, limit=want)
            except TorenError:
                # The response has started: an exception now could only abort the
                # connection (a client sees a truncated body). The page ends here instead,
                # whole, with ``next_after`` set: the client reads on from there.
                log.warning(
                    "reading events of %s after seq %d failed", run_id, after, exc_info=True
                )
                more = True
                break
            continue
        break
    parts.append(b'],"next_after":' + (str(last).encode() if more else b"null") + b"}")
    yield b"".join(parts)


@_route(
    "GET",
    "/runs/{run_id}/verify",
    response_model=models.RunVerification,
    tags=["events"],
    summary="Re-derive every digest of a run from its stored events and blobs",
    responses=_errors(404, 422),
)
async def verify_run(run_id: str, state: State) -> dict[str, object]:
    """Per step: `verified` (the digest re-derives byte for byte from the log),
    `unverifiable` (the log lacks an input; `note` says which) or `mismatch` (with the
    step's seq, stream and position); `response`: whether the recorded answer and usage
    match the step's response digest (`not covered` for events of an earlier version).
    `chain`: the run's hash chain, with each break's seq and position. `ok` is false on
    any mismatch or break. The rules are docs/digest.md."""
    await _run_or_404(state, run_id)
    report = await verify_run_report(state.store, run_id)
    return cast(dict[str, Any], state.redact(report.to_dict()))


@_route(
    "GET",
    "/runs/{run_id}/invalidations",
    response_model=models.InvalidationList,
    tags=["events"],
    summary="What changed at each invalidation of a run",
    responses=_errors(404, 422),
)
async def list_invalidations(run_id: str, state: State) -> dict[str, object]:
    """For every `StreamInvalidated` of the run, which parts of the request differ
    between the superseded step and the step recorded at its position afterwards
    (message 0 changed; tool `x`'s spec changed; parameter `temperature` 0.2 -> 0.7)."""
    await _run_or_404(state, run_id)
    events = await state.store.load_events(run_id)
    # Only the requests at invalidated positions are compared: read only their blobs.
    at = {
        (e.stream, e.payload.from_pos) for e in events if isinstance(e.payload, StreamInvalidated)
    }
    involved = [e for e in events if (e.stream, e.position) in at]
    found = explain_invalidations(events, await load_blobs(state.store, involved))
    return cast(dict[str, object], state.redact({"invalidations": found}))


@_route(
    "GET",
    "/runs/{run_id}/stream",
    response_class=StreamingResponse,
    tags=["events"],
    summary="Stream a run's events live (Server-Sent Events)",
    responses={
        200: {
            "description": "An SSE stream: `event` (id = seq), `delta`, `end`, `error` "
            "messages and `: heartbeat` comments. See docs/http-api.md.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **_errors(404, 422),
    },
)
async def stream_events(
    run_id: str,
    state: State,
    after: Annotated[
        int | None,
        Query(ge=0, le=models.MAX_SEQ, description="Start after this seq (0: the whole log)."),
        models.ASCII_INT,
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=r"^[0-9]{1,18}$",
            description="Resume after this seq; wins over `after` (EventSource reconnects "
            "with the original URL and this header).",
        ),
    ] = None,
) -> StreamingResponse:
    await _run_or_404(state, run_id)
    start = int(last_event_id) if last_event_id is not None else (after or 0)
    stream = RunStream(
        state.store,
        run_id,
        start,
        live=state.live,
        redact=state.redact,
        settings=state.stream,
        closing=lambda: state.closing,
        problem=await resume_problem(state.store, run_id, start),
    )
    return StreamingResponse(
        stream.body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@_route(
    "POST",
    "/runs/{run_id}/messages",
    status_code=202,
    response_model=models.MessageAccepted,
    tags=["runs"],
    summary="Send a message to a run",
    responses=_errors(404, 409, 415, 422),
)
async def send_message(
    run_id: str, body: models.SendMessageRequest, state: State
) -> dict[str, object]:
    run = await _run_or_404(state, run_id)
    if run.terminal:
        raise ApiError(409, "run_finished", f"run {run_id!r} is {run.status}; it takes no messages")
    message_id = await core_send_message(state.store, run_id, body.name, body.payload)
    waits = list(run.waiting_for or []) if run.status == RunStatus.WAITING else None
    return {
        "run_id": run_id,
        "message_id": message_id,
        "waiting_for": waits,
        "warning": unexpected_message(run_id, body.name, waits),
    }


@_route(
    "POST",
    "/runs/{run_id}/cancel",
    status_code=202,
    response_model=models.Run,
    tags=["runs"],
    summary="Request cancellation of a run",
    responses=_errors(404),
)
async def cancel_run(run_id: str, state: State) -> dict[str, object]:
    await _run_or_404(state, run_id)
    run = await state.store.request_cancel(run_id, now=time.time())
    if state.runtime is not None:
        state.runtime.cancel_local(run_id)
    return _run(state, run)


@_route(
    "POST",
    "/runs/{run_id}/retry",
    status_code=202,
    response_model=models.Run,
    tags=["runs"],
    summary="Retry a failed run under the code now deployed",
    description="The run continues from its log: every recorded successful step replays "
    "for free; the recorded failure that ended it (a tool that raised, a model call that "
    "failed after its retries, a failed child) runs again live, as does agent code that "
    "raised. The body is optional. 409 `run_not_retryable` for a run that is not failed "
    "(a cancelled run is final; fork a completed one).",
    responses=_errors(404, 409, 415, 422),
)
async def retry_run(
    run_id: str, state: State, body: models.RetryRunRequest | None = None
) -> dict[str, object]:
    await _run_or_404(state, run_id)
    limits = body or models.RetryRunRequest()
    run = await core_retry_run(
        state.store,
        state.agents,
        run_id,
        max_steps=limits.max_steps,
        max_cost_usd=limits.max_cost_usd,
    )
    return _run(state, run)


@_route(
    "POST",
    "/runs/{run_id}/fork",
    status_code=201,
    response_model=models.Run,
    tags=["runs"],
    summary="Fork a run from one of its steps",
    description="A new run whose steps before `at` replay from this run's log without "
    "being paid again, and which runs live from there under the code now deployed. The "
    "source run is not changed. The new run's `forked_from` names the source and `at`. "
    "409 `fork_point_not_found` for a point the run does not have.",
    responses=_errors(404, 409, 415, 422),
)
async def fork_run(run_id: str, body: models.ForkRunRequest, state: State) -> dict[str, object]:
    await _run_or_404(state, run_id)
    extra = {"input": body.input} if "input" in body.model_fields_set else {}
    run = await core_fork_run(state.store, state.agents, run_id, at=body.at, **extra)
    return _run(state, run)


# -- agents and operations ----------------------------------------------------------------


@_route(
    "GET",
    "/agents",
    response_model=models.AgentList,
    tags=["agents"],
    summary="List agents and their processes",
    responses=_errors(),
)
async def list_agents(state: State) -> dict[str, object]:
    # An agent that fails to load says why, and that message may quote a key (an
    # exception raised while importing its tools.py, say).
    agents = [_agent_info(state.agents, name, state.paths) for name in state.agents.names()]
    return cast(dict[str, object], state.redact({"agents": agents}))


def _agent_info(agents: AgentResolver, name: str, paths: Callable[[str], str]) -> dict[str, object]:
    programs = getattr(agents, "programs", None)  # toren.Registry knows every process
    if isinstance(programs, dict):
        return {"name": name, "processes": sorted(p for a, p in programs if a == name)}
    try:
        return {"name": name, "processes": list(agents.resolve(name, "main").processes)}
    except TorenError as exc:
        return {"name": name, "processes": [], "error": paths(exc.message)}


@_route("GET", "/health", response_model=models.Health, tags=["operations"], summary="Liveness")
async def health() -> dict[str, object]:
    return {"status": "ok", "version": toren.__version__}


@_route(
    "GET",
    "/ready",
    response_model=models.Ready,
    tags=["operations"],
    summary="Readiness: the database answers",
    responses=_errors(503),
)
async def ready(state: State) -> dict[str, object]:
    try:
        await state.store.get_run("run_readiness_probe")
    except Exception as exc:
        log.warning("readiness check failed: %s", exc)
        raise ApiError(503, "not_ready", "the database is not reachable") from None
    return {"status": "ready"}


@_route(
    "GET",
    "/plan",
    response_model=models.PlanReport,
    tags=["operations"],
    summary="The replay plan: what the current code would invalidate, and at what cost",
)
async def plan(
    state: State,
    limit: Annotated[int, Query(ge=1, le=PLAN_LIMIT), models.ASCII_INT] = PLAN_LIMIT,
) -> dict[str, object]:
    """Replay every in-flight run (queued, running, waiting) against the code this server
    resolves, executing nothing live, and report per run and stream whether it replays
    cleanly or would be invalidated, from which step, with which digests, and the recorded
    cost of the suffix that would be re-run."""
    runtime = state.runtime
    version = runtime.deps.code_version if runtime is not None else None
    report = await plan_report(state.store, state.agents, code_version=version, limit=limit)
    return cast(dict[str, object], state.redact(report))


async def get_metrics(state: State) -> PlainTextResponse:
    stats = {
        **await state.store.stats(),
        "queue_depth": await state.store.queue_depth(now=time.time()),
        "schedules": await state.store.schedules.all(),
    }
    return PlainTextResponse(metrics.render(stats, state.runtime), media_type=metrics.CONTENT_TYPE)


__all__ = ["ApiState", "create_app"]
