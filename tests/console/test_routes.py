"""The console's HTTP surface, without a browser: what is public, what needs the token."""

from __future__ import annotations

import httpx

from toren.store import Store

from .support import TOKEN, serve, use

PAGES = ["/", "/agents", "/plan", "/login", "/runs/run_0000", "/console/static/console.css"]


async def test_pages_are_public_shells_and_data_needs_the_token(sqlite_store: Store) -> None:
    async with serve(sqlite_store) as server:
        run_id = await server.start("support", {})
        await server.wait_status(run_id, "waiting")
        async with httpx.AsyncClient(base_url=server.url) as http:
            for path in PAGES:
                r = await http.get(path)
                assert r.status_code == 200, path
                assert run_id not in r.text  # a shell: no data without the token
            page = await http.get(f"/runs/{run_id}")
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert page.headers["referrer-policy"] == "no-referrer"
            assert f'data-run-id="{run_id}"' in page.text
            assert (await http.get("/runs/bad%3Cscript%3E")).status_code in (401, 404)
            assert (await http.get("/console/static/../routes.py")).status_code in (401, 404)
            for path in (
                "/console/api/summary",
                "/v1/plan",
                f"/console/api/runs/{run_id}/calls/1",
                "/v1/runs",
            ):
                r = await http.get(path)
                assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", path

            auth = {"Authorization": f"Bearer {TOKEN}"}
            summary = (await http.get("/console/api/summary", headers=auth)).json()
            assert summary["runs"] == 1 and summary["runs_by_status"] == {"waiting": 1}
            assert summary["steps"] >= 5 and float(summary["cost_usd"]) > 0

            events = (await http.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["events"]
            call = next(e for e in events if e["type"] == "ModelCallRecorded")
            tool = next(e for e in events if e["type"] == "ToolCallRecorded")
            r = await http.get(f"/console/api/runs/{run_id}/calls/{call['seq']}", headers=auth)
            assert [m["role"] for m in r.json()["messages"]] == ["system", "user"]
            for bad in (str(tool["seq"]), "0", "x", "9" * 19):
                r = await http.get(f"/console/api/runs/{run_id}/calls/{bad}", headers=auth)
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

            use(server.registry, "v2")
            plan = (await http.get("/v1/plan", headers=auth)).json()
            assert (plan["runs"], plan["invalidated"]) == (1, 1)
            (finding,) = plan["plans"][0]["findings"]
            assert (finding["stream"], finding["from_pos"]) == ("main", 3)
            assert float(plan["rerun_cost_usd"]) > 0


async def test_the_console_is_not_part_of_the_versioned_api(sqlite_store: Store) -> None:
    async with serve(sqlite_store) as server, httpx.AsyncClient(base_url=server.url) as http:
        doc = await http.get("/v1/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert not [p for p in doc.json()["paths"] if not p.startswith(("/v1", "/metrics"))]
