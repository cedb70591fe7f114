"""`bus serve --mcp` against `bus mcp`: tool-call rates over HTTP and stdio, and with 16 agents.

In one run, on one fresh bus file:
- one agent's tool-call rate over Streamable HTTP against the same calls over
  stdio (`bus mcp`, the baseline; target >= 0.7x);
- 16 agents' aggregate rate over HTTP, each in its own process with its own
  token, against one agent's over HTTP (target >= 2x);
- the p99 latency of one tool call with 16 agents calling at once;
- the CPU budget: CPU milliseconds per tool call in the server process and
  in the clients, alone and with 16 agents, and the most 16 agents can reach
  on this machine's cores (Linux: read from /proc).
Each agent does rounds of publish (to itself), poll and ack: one write, one
read, one write.

Why the budget: one agent's call is CPU work in series, in the client then in
the server, with the client waiting. 16 agents can at best keep every core
busy, so their rate is at most cores / (server + client CPU per call), and
their ratio to one agent at most cores x one agent's seconds per call /
(CPU per call with 16). When one agent's call is all CPU (it uses one core),
that is below `cores`x, and below it again by what 16 processes sharing the
cores add to each call's CPU.

    python scripts/bench_remote.py [--rounds 200] [--agents 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from bus import Bus

TARGET_HTTP_VS_STDIO = 0.7
TARGET_MANY_VS_ONE = 2.0


async def rounds(client: Client, count: int, agent: str) -> list[float]:
    """Seconds per tool call, for `count` rounds of publish, poll and ack."""
    latencies = []

    async def timed(tool: str, arguments: dict[str, Any]) -> Any:
        started = time.perf_counter()
        result = await client.call_tool(tool, arguments)
        latencies.append(time.perf_counter() - started)
        if result.is_error:
            raise RuntimeError(f"{tool}: {result.content}")
        return result.structured_content

    for n in range(count):
        await timed("publish", {"type": "bench", "to": agent, "payload": {"n": n}})
        found = (await timed("poll", {"limit": 10}))["messages"]
        if found:
            await timed("ack", {"seq": found[-1]["seq"]})
    return latencies


def own_cpu_s() -> float:
    """CPU seconds this process has used (every thread), user and system."""
    times = os.times()
    return times.user + times.system


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds process `pid` has used, from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def over_http(url: str, token: str, count: int, agent: str,
                    start_at: float = 0.0, server_pid: int | None = None) -> dict[str, Any]:
    """The latencies of one agent's rounds over HTTP, when they began and ended, and the
    CPU seconds they took in this process (and in the server, given its pid)."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        await client.list_tools()  # warm up: the first call builds the agent's server
        await anyio.sleep(max(0.0, start_at - time.time()))  # all agents start together
        began, cpu, server_cpu = time.time(), own_cpu_s(), _cpu_of(server_pid)
        latencies = await rounds(client, count, agent)
        return {"latencies": latencies, "began": began, "ended": time.time(),
                "cpu_s": own_cpu_s() - cpu, "server_cpu_s": _spent(server_pid, server_cpu)}


def _cpu_of(pid: int | None) -> float | None:
    return process_cpu_s(pid) if pid is not None else None


def _spent(pid: int | None, before: float | None) -> float | None:
    after = _cpu_of(pid)
    return after - before if after is not None and before is not None else None


async def over_stdio(db: Path, count: int, agent: str) -> list[float]:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "bus.cli", "--db", str(db), "mcp", "--agent", agent])
    async with Client(params) as client:
        # Warm up with a call, not the listing: bus mcp lists its tools before the SDK is loaded.
        await client.call_tool("poll", {"limit": 1})
        return await rounds(client, count, agent)


def agent_process(url: str, token: str, count: int, agent: str, start_at: float) -> None:
    """One of the 16: prints its latencies and times as JSON when done."""
    print(json.dumps(anyio.run(over_http, url, token, count, agent, start_at)), flush=True)


def start_server(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(db), "serve", "--mcp",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    if " at http://" not in line:
        raise RuntimeError(line + proc.stderr.read())
    return proc, line.split(" at ")[1].split()[0] + "mcp"


STARTUP_S = 60.0  # the agents' processes start and connect before this; then all call at once


def many_agents(url: str, tokens: dict[str, str], count: int,
                server_pid: int) -> tuple[float, list[float], dict[str, float | None]]:
    """Seconds from the first agent's first call to the last one's end, every latency,
    and the CPU seconds the agents' calls took in the clients and in the server."""
    start_at = time.time() + STARTUP_S
    procs = [subprocess.Popen([sys.executable, __file__, "--agent-process", url, token,
                               str(count), agent, str(start_at)], stdout=subprocess.PIPE,
                              text=True) for agent, token in tokens.items()]
    server_cpu: list[float | None] = []
    timer = threading.Timer(max(0.0, start_at - time.time()),
                            lambda: server_cpu.append(process_cpu_s(server_pid)))
    timer.start()
    runs = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"an agent process failed (exit {proc.returncode})")
        runs.append(json.loads(out.splitlines()[-1]))
    timer.join()
    if min(r["began"] for r in runs) > start_at + 1.0:
        print("note: the agents started late; raise STARTUP_S on this machine", file=sys.stderr)
    span = max(r["ended"] for r in runs) - min(r["began"] for r in runs)
    cpu = {"client_cpu_s": sum(r["cpu_s"] for r in runs),
           "server_cpu_s": _spent(server_pid, server_cpu[0] if server_cpu else None)}
    return span, [latency for r in runs for latency in r["latencies"]], cpu


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--agent-process":
        agent_process(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5],
                      float(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds per agent")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bus.db"
        agents = [f"agent-{i:02d}" for i in range(options.agents)]
        with Bus.open(db, create=True) as bus:
            tokens = {agent: bus.tokens.create(agent).token for agent in ["solo", *agents]}
        stdio = anyio.run(over_stdio, db, options.rounds, "stdio-solo")
        proc, url = start_server(db)
        try:
            solo = anyio.run(over_http, url, tokens["solo"], options.rounds, "solo", 0.0,
                             proc.pid)
            wall, many, many_cpu = many_agents(url, {a: tokens[a] for a in agents},
                                               options.rounds, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    one = solo["latencies"]
    one_cpu = {"client_cpu_s": solo["cpu_s"], "server_cpu_s": solo["server_cpu_s"]}
    report(options, stdio, one, wall, many, cpu_budget(one, one_cpu, many, many_cpu, wall))


def cpu_budget(one: list[float], one_cpu: dict[str, float | None], many: list[float],
               many_cpu: dict[str, float | None], wall: float) -> dict[str, Any]:
    """CPU ms per call in the server and the clients, alone and with many agents; the
    cores the many used; and the most their rate and ratio can be on this machine."""
    cores = os.cpu_count() or 1
    figures: dict[str, Any] = {"cores": cores}
    for label, calls, cpu in (("one", one, one_cpu), ("many", many, many_cpu)):
        for side in ("server", "client"):
            spent = cpu[f"{side}_cpu_s"]
            figures[f"{label}_{side}_cpu_ms_per_call"] = (
                None if spent is None else round(1000 * spent / len(calls), 3))
    if figures["many_server_cpu_ms_per_call"] is None:
        return figures
    many_cpu_s = (figures["many_server_cpu_ms_per_call"]
                  + figures["many_client_cpu_ms_per_call"]) / 1000
    one_call_s = sum(one) / len(one)
    figures["many_cores_used"] = round(many_cpu_s * len(many) / wall, 2)
    figures["many_most_calls_per_s"] = round(cores / many_cpu_s, 1)
    figures["many_vs_one_most"] = round(cores * one_call_s / many_cpu_s, 2)
    return figures


def report(options: Any, stdio: list[float], one: list[float], wall: float,
           many: list[float], budget: dict[str, Any]) -> None:
    stdio_rate, one_rate = len(stdio) / sum(stdio), len(one) / sum(one)
    many_rate = len(many) / wall
    many.sort()
    figures = {
        "stdio_calls_per_s": round(stdio_rate, 1), "http_calls_per_s": round(one_rate, 1),
        "http_vs_stdio": round(one_rate / stdio_rate, 2),
        "agents": options.agents, "many_calls_per_s": round(many_rate, 1),
        "many_vs_one": round(many_rate / one_rate, 2),
        "many_p99_ms": round(1000 * many[int(0.99 * (len(many) - 1))], 1),
        "many_span_s": round(wall, 1),
        **budget,
        "load": os.getloadavg(),
    }
    if options.json:
        print(json.dumps(figures))
        return
    print(f"one agent over stdio: {figures['stdio_calls_per_s']} calls/s")
    print(f"one agent over HTTP:  {figures['http_calls_per_s']} calls/s"
          f" = {figures['http_vs_stdio']}x stdio (target >= {TARGET_HTTP_VS_STDIO}x)")
    print(f"{options.agents} agents over HTTP: {figures['many_calls_per_s']} calls/s aggregate"
          f" = {figures['many_vs_one']}x one agent (target >= {TARGET_MANY_VS_ONE}x)")
    print(f"p99 tool latency with {options.agents} agents: {figures['many_p99_ms']} ms")
    if figures.get("many_vs_one_most") is not None:
        print(f"CPU ms per call, server + client: one agent"
              f" {figures['one_server_cpu_ms_per_call']} + {figures['one_client_cpu_ms_per_call']},"
              f" {options.agents} agents {figures['many_server_cpu_ms_per_call']}"
              f" + {figures['many_client_cpu_ms_per_call']}")
        print(f"{options.agents} agents used {figures['many_cores_used']} of {figures['cores']}"
              f" cores; at most {figures['many_most_calls_per_s']} calls/s ="
              f" {figures['many_vs_one_most']}x one agent on these cores")
    print(f"load average: {figures['load']}")


if __name__ == "__main__":
    main()
