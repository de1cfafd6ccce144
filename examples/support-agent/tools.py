"""Tools of the support agent. Every public function here is a tool; its JSON schema
comes from the type hints and the docstring."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Literal

import toren

_ORDERS = {
    "A-17": {"status": "shipped", "carrier": "DHL", "tracking": "JD0146000031", "total_eur": 42},
    "B-3": {"status": "processing", "carrier": None, "tracking": None, "total_eur": 180},
}


@toren.tool(side_effects=False)
def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by its id.

    Args:
        order_id: The order id, e.g. "A-17".
    """
    order = _ORDERS.get(order_id.strip().upper())
    if order is None:
        raise LookupError(f"no order {order_id!r}; order ids look like 'A-17'")
    return {"order_id": order_id, **order}


@toren.tool(side_effects=True)
def send_email(
    to: str, subject: str, body: str, priority: Literal["normal", "high"] = "normal"
) -> dict[str, str]:
    """Send an email to the customer. This has a side effect: call it once per message.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
        priority: Delivery priority.
    """
    message = {"to": to, "subject": subject, "body": body, "priority": priority}
    message_id = hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()[:12]
    # A stand-in for a mail API: append to an outbox file when one is configured, so a
    # test can count how many emails were really sent.
    outbox = os.environ.get("SUPPORT_AGENT_OUTBOX")
    if outbox:
        with open(outbox, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"id": message_id, **message}) + "\n")
    return {"message_id": message_id, "status": "sent"}
