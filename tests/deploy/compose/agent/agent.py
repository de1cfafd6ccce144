"""The agent the Compose upgrade test deploys, written against the context API.

Input ``{"topic": T, "wait": bool, "slow": N}``:

- with ``wait``: one model step carrying prompts/greeting.md, then a wait for the message
  ``approval`` (the upgrade test edits greeting.md, so this recorded step is the one that
  is invalidated when such a run resumes under the new image);
- then N model steps that the loopback model answers slowly (the upgrade happens while a
  run is in the middle of them);
- then a final model step carrying prompts/final.md, whose text the output repeats, so the
  output says which code finished the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPTS = Path(__file__).parent / "prompts"
GREETING = (PROMPTS / "greeting.md").read_text(encoding="utf-8").strip()
FINAL = (PROMPTS / "final.md").read_text(encoding="utf-8").strip()
MODEL = "openai:gpt-4o-mini"


def _ask(system: str | None, user: str) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user}]


async def main(ctx: Any, input: Any) -> dict[str, Any]:
    topic = str(input["topic"])
    approval = None
    if input.get("wait"):
        await ctx.model(MODEL, _ask(GREETING, f"{topic}: greet"))
        approval = await ctx.wait_for_message("approval")
    for i in range(int(input.get("slow", 0))):
        await ctx.model(MODEL, _ask(None, f"{topic}: slow {i}"))
    reply = await ctx.model(MODEL, _ask(FINAL, f"{topic}: final"))
    return {"answer": reply.text, "final_prompt": FINAL, "approval": approval}
