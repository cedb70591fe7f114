"""One agent over HTTP, in its own process, through the MCP SDK's Streamable HTTP client.

    python tests/support/remote_agent.py URL TOKEN MODE ARGS_JSON

Modes (each prints one JSON line per result, flushed, so a parent sees what
was acknowledged even if this process or the server dies):
- `calls`: ARGS_JSON is a list of [tool, arguments]; prints each result.
- `exchange`: publish `count` messages to `to`, claim each task of `tasks`,
  then poll and ack until `expect` messages came in; prints a summary.
- `publish_ids`: publish a message with each id of `ids`; prints each result.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import TextContent


def out(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        return {"error": " ".join(c.text for c in result.content if isinstance(c, TextContent))}
    return {"result": result.structured_content}


async def exchange(client: Client, args: dict[str, Any]) -> None:
    errors: list[str] = []
    for n in range(args["count"]):
        done = await call(client, "publish", {"type": "work", "to": args["to"],
                                              "payload": {"n": n}})
        errors += [done["error"]] if "error" in done else []
    granted = []
    for task in args["tasks"]:
        done = await call(client, "claim", {"task": task, "lease_ms": 600_000})
        if "error" in done:
            errors.append(done["error"])
        elif done["result"]["granted"]:
            granted.append(task)
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.get("deadline_s", 120)
    while len(received) < args["expect"] and time.monotonic() < deadline:
        done = await call(client, "poll", {"limit": 100, "wait_seconds": 1.0})
        if "error" in done:
            errors.append(done["error"])
            continue
        messages = done["result"]["messages"]
        received += messages
        if messages:
            acked = await call(client, "ack", {"seq": messages[-1]["seq"]})
            errors += [acked["error"]] if "error" in acked else []
    out({"received": [[m["from"], m["payload"]["n"], m["id"]] for m in received],
         "granted": granted, "errors": errors})


async def main(url: str, token: str, mode: str, args: Any) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        if mode == "calls":
            for tool, arguments in args:
                out(await call(client, tool, arguments))
        elif mode == "publish_ids":
            for message_id in args["ids"]:
                out({"id": message_id, **await call(client, "publish", {
                    "type": "crash", "id": message_id})})
        elif mode == "exchange":
            await exchange(client, args)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
