"""A tiny loopback model server: every request sleeps LATENCY (200 ms) and returns ~2 KB
of JSON. Raw asyncio HTTP/1.1 with keep-alive, no framework, so it stays cheap at 1,000
concurrent connections.

    python bench/model_server.py --port 8765 [--latency 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import fake_model


def _response(i: int) -> bytes:
    body = json.dumps({"id": f"cmpl-{i}", "model": "bench-fake", "content": fake_model(i)[:1900]})
    return (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n{body}"
    ).encode()


RESPONSES = [_response(i) for i in range(64)]


async def main(host: str, port: int, latency: float) -> None:
    counter = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal counter
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                await asyncio.sleep(latency)
                counter += 1
                writer.write(RESPONSES[counter % 64])
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, backlog=4096)
    print(f"model server on http://{host}:{port} latency={latency}s", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--latency", type=float, default=0.2)
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loopback only")
    asyncio.run(main(a.host, a.port, a.latency))
