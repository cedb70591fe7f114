"""The MCP server's costs: how long `bus mcp` takes to start, and a publish through it.

Start time is from spawning `bus mcp --agent bench` to the end of the MCP
handshake (the SDK's stdio client, as an agent's client would do it), and
to the first tool listing. Start to every listing is from spawn to the
answers to tools/list, prompts/list, resources/list and
resources/templates/list asked together, as Claude Code asks them (it
registers a server only once all are answered): with the SDK's clients of
both eras (`ClientSession` after its handshake, and `Client`, whose requests
carry the 2026 envelope), cold (a cache directory of its own for each start)
and warm (one shared); beside them the floor, the time `bus --version` takes
from spawn to exit (the interpreter and the CLI's imports), which a shared
machine's load inflates as much. Publish latency is one `publish` tool call, from
the client's send to its result, against `Bus.publish` on the same file in
the same run (the baseline): the difference is the protocol, the pipes and
the SDK's argument validation.

    python scripts/bench_mcp.py [--publishes 2000] [--starts 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import Client
from mcp import ClientSession
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

from bus import Bus

TARGET_START_S = 1.0
TARGET_PUBLISH_P50_MS = 2.0


def server_params(db: Path, cache: Path | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "bus.cli", "--db", str(db), "mcp", "--agent", "bench"],
                                 env=None if cache is None else {"XDG_CACHE_HOME": str(cache)})


async def every_listing(session: Client | ClientSession) -> None:
    await asyncio.gather(session.list_tools(), session.list_prompts(), session.list_resources(),
                         session.list_resource_templates())


async def every_listing_s(db: Path, cache: Path, era: str) -> float:
    """Seconds from spawn to the answers to every listing, asked together."""
    began = time.perf_counter()
    if era == "2026":
        async with Client(server_params(db, cache), cache=None) as client:
            await every_listing(client)
            return time.perf_counter() - began
    async with stdio_client(server_params(db, cache)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await every_listing(session)
            return time.perf_counter() - began


def cli_floor_s(starts: int) -> float:
    """Median seconds from spawning `bus --version` to its exit."""
    times = []
    for _ in range(starts):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bus.cli", "--version"], check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - began)
    return round(statistics.median(times), 3)


def every_listing_times(db: Path, scratch: Path, starts: int) -> dict[str, float]:
    """Median seconds to every listing, by era and cache state."""
    figures = {}
    for era in ("handshake", "2026"):
        for state in ("cold", "warm"):
            times = [asyncio.run(every_listing_s(
                db, scratch / f"cache-{era}-{state}-{n if state == 'cold' else 0}", era))
                for n in range(starts + (state == "warm"))]
            figures[f"every_listing_{era}_{state}_s_median"] = round(statistics.median(
                times[1:] if state == "warm" else times), 3)  # warm: the first start fills it
    return figures


async def start_times(db: Path, starts: int) -> tuple[list[float], list[float]]:
    """Seconds from spawn to handshake done, and to the tool list, for each start."""
    handshakes, listings = [], []
    for _ in range(starts):
        began = time.perf_counter()
        async with Client(server_params(db), cache=None) as client:
            handshakes.append(time.perf_counter() - began)
            await client.list_tools()
            listings.append(time.perf_counter() - began)
    return handshakes, listings


async def mcp_publish_ms(db: Path, publishes: int) -> list[float]:
    async with Client(server_params(db), cache=None) as client:
        latencies = []
        for n in range(publishes):
            began = time.perf_counter()
            result = await client.call_tool("publish", {"type": "bench", "payload": {"n": n}})
            latencies.append((time.perf_counter() - began) * 1000)
            assert not result.is_error, result.content
    return latencies


def direct_publish_ms(db: Path, publishes: int) -> list[float]:
    with Bus.open(db) as bus:
        latencies = []
        for n in range(publishes):
            began = time.perf_counter()
            bus.publish("bench", "bench", {"n": n})
            latencies.append((time.perf_counter() - began) * 1000)
    return latencies


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] if len(values) > 1 \
        else values[0]


def measure(publishes: int, starts: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as scratch:
        db = Path(scratch) / "bus.db"
        Bus.open(db).close()
        handshakes, listings = asyncio.run(start_times(db, starts))
        every = every_listing_times(db, Path(scratch), starts)
        every["cli_floor_s_median"] = cli_floor_s(starts)
        direct = direct_publish_ms(db, publishes)
        served = asyncio.run(mcp_publish_ms(db, publishes))
    p50, base = percentile(served, 50), percentile(direct, 50)
    return {"starts": starts, "start_s_median": round(statistics.median(handshakes), 3),
            "start_to_tool_list_s_median": round(statistics.median(listings), 3), **every,
            "target_start_s": TARGET_START_S, "publishes": publishes,
            "publish_p50_ms": round(p50, 3), "publish_p95_ms": round(percentile(served, 95), 3),
            "direct_publish_p50_ms": round(base, 3), "ratio_p50": round(p50 / base, 1),
            "target_publish_p50_ms": TARGET_PUBLISH_P50_MS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.publishes, args.starts)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"start: {figures['start_s_median']} s to the handshake, "
          f"{figures['start_to_tool_list_s_median']} s to the tool list "
          f"(median of {args.starts}; target under {TARGET_START_S} s)")
    for key, value in figures.items():
        if key.startswith("every_listing_"):
            era, state = key.split("_")[2:4]
            print(f"start to every listing ({era} era, {state}): {value} s")
    print(f"floor: bus --version takes {figures['cli_floor_s_median']} s from spawn to exit")
    print(f"publish through the server: p50 {figures['publish_p50_ms']} ms, "
          f"p95 {figures['publish_p95_ms']} ms (target p50 under {TARGET_PUBLISH_P50_MS} ms)")
    print(f"Bus.publish directly: p50 {figures['direct_publish_p50_ms']} ms; "
          f"the server costs {figures['ratio_p50']}x")


if __name__ == "__main__":
    main()
