"""Python clients for the Toren HTTP API: :class:`TorenClient` (blocking) and
:class:`AsyncTorenClient`, with typed results and :class:`TorenAPIError` carrying the
server's error code (its subclasses, drawn in ``toren.client._errors``, say what else went
wrong: unreachable, a silent stream, an answer that is not the Toren API's, a bad token).

    from toren.client import TorenClient

    with TorenClient("http://127.0.0.1:8000", token="...") as client:
        run = client.start_run("support", {"question": "Where is my order?"})
        for event in client.stream(run.id):
            print(event.seq, event.type)
        print(client.get_run(run.id).output)
"""

from toren.client._async import AsyncTorenClient
from toren.client._errors import (
    TorenAPIError,
    TorenConnectionError,
    TorenMessageWarning,
    TorenResponseError,
    TorenStreamTimeout,
    TorenTokenError,
)
from toren.client._sync import TorenClient
from toren.client._types import Agent, Delta, Event, EventPage, Run, RunPage, Usage

__all__ = [
    "Agent",
    "AsyncTorenClient",
    "Delta",
    "Event",
    "EventPage",
    "Run",
    "RunPage",
    "TorenAPIError",
    "TorenClient",
    "TorenConnectionError",
    "TorenMessageWarning",
    "TorenResponseError",
    "TorenStreamTimeout",
    "TorenTokenError",
    "Usage",
]
