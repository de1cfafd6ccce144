"""A test agent written against the context API: four model steps in one stream.

Step 1 carries the text of prompts/step1.md (editing it invalidates from step 1), step 2
is slow (the scripted model sleeps), so a test can act while the run is mid-flight.
With ``{"ask": true}`` as input it waits for a message ``approval`` after step 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPT = (Path(__file__).parent / "prompts" / "step1.md").read_text(encoding="utf-8").strip()
MODEL = "scripted:script.yaml"


async def main(ctx: Any, input: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "step 0"}]
    reply = await ctx.model(MODEL, messages)
    messages += [reply.message(), {"role": "user", "content": f"step 1: {PROMPT}"}]
    reply = await ctx.model(MODEL, messages)
    if isinstance(input, dict) and input.get("ask"):
        answer = await ctx.wait_for_message("approval")
        messages += [reply.message(), {"role": "user", "content": f"approved: {answer}"}]
        reply = await ctx.model(MODEL, messages)
        return {"answer": reply.text, "approval": answer}
    if isinstance(input, dict) and input.get("fail"):
        raise RuntimeError("the agent gave up on purpose")
    messages += [reply.message(), {"role": "user", "content": "step 2 slow"}]
    reply = await ctx.model(MODEL, messages)
    messages += [reply.message(), {"role": "user", "content": "step 3"}]
    reply = await ctx.model(MODEL, messages)
    return {"answer": reply.text, "steps": 4}
