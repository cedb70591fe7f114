"""A request and its reply through `bus mcp`: the three-call path against `exchange`, one run.

Two real servers on one bus file (agents A and B), each driven by the SDK's
stdio client, as ../shared/peerbench/mcp runs them. The two ways, rounds
alternating so load drifts hit both alike:

    three calls (the baseline, the tools before exchange):
        A: publish ; poll(wait_seconds=30) ; ack(seq)
        B: poll(wait_seconds=30) ; publish(in_reply_to=...) ; ack(seq)
    exchange (one call on each side):
        A: exchange(to=B, wait_seconds=30)
        B: reply(seq, wait_seconds=30)      (answers, acks, and waits for the next)

Each figure is A's time from the first call sent to the reply held and
acknowledged. Target: exchange p50 <= 0.5 x the three-call p50.

    python scripts/bench_mcp_exchange.py [--n 100] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcp import Client
from mcp import StdioServerParameters

from bus import Bus

TARGET_RATIO = 0.5


def server(db: Path, agent: str) -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=[
        "-m", "bus.cli", "--db", str(db), "mcp", "--agent", agent]), cache=None)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def answer_in_three(b: Client, count: int) -> None:
    """B, before exchange: poll, publish the answer, ack."""
    for _ in range(count):
        question = (await call(b, "poll", limit=1, wait_seconds=30))["messages"][0]
        await call(b, "publish", type="answer", to="A", payload=question["payload"],
                   in_reply_to=question["id"])
        await call(b, "ack", seq=question["seq"])


async def answer_in_one(b: Client, count: int) -> None:
    """B with reply: each call answers one question and waits for the next."""
    question = (await call(b, "poll", limit=1, wait_seconds=30))["messages"][0]
    for left in range(count - 1, -1, -1):
        got = await call(b, "reply", seq=question["seq"], type="answer",
                         payload=question["payload"], limit=1, wait_seconds=30 if left else 0)
        question = got["messages"][0] if left else None


async def three_calls(a: Client, n: int) -> float:
    began = time.perf_counter()
    await call(a, "publish", type="question", to="B", payload={"n": n})
    reply = (await call(a, "poll", limit=1, wait_seconds=30))["messages"][0]
    await call(a, "ack", seq=reply["seq"])
    assert reply["payload"] == {"n": n}, reply
    return (time.perf_counter() - began) * 1000


async def one_exchange(a: Client, n: int) -> float:
    began = time.perf_counter()
    got = await call(a, "exchange", to="B", type="question", payload={"n": n}, wait_seconds=30)
    assert got["reply"]["payload"] == {"n": n} and got["acked"], got
    return (time.perf_counter() - began) * 1000


async def round_of(way: Any, answer: Any, n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as scratch:
        db = Path(scratch) / "bus.db"
        Bus.open(db, create=True).close()
        async with server(db, "A") as a, server(db, "B") as b:
            for warming in (a, b):  # a server answers its listing before it has loaded the SDK
                await call(warming, "poll", limit=1)
            answering = asyncio.create_task(answer(b, n))
            times = [await way(a, i) for i in range(n)]
            await answering
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3)}


async def main_async(n: int, rounds: int) -> dict[str, Any]:
    best: dict[str, dict[str, float]] = {}
    for index in range(rounds):
        ways = [("three_calls", three_calls, answer_in_three),
                ("exchange", one_exchange, answer_in_one)]
        for name, way, answer in ways if index % 2 == 0 else ways[::-1]:
            figures = summary(await round_of(way, answer, n))
            if name not in best or figures["p50_ms"] < best[name]["p50_ms"]:
                best[name] = figures
    ratio = best["exchange"]["p50_ms"] / best["three_calls"]["p50_ms"]
    return {"n": n, "rounds": rounds, **best, "calls": {"three_calls": 3, "exchange": 1},
            "calls_of_the_answerer": {"three_calls": 3, "exchange": 1},
            "ratio_p50": round(ratio, 3), "target": f"<= {TARGET_RATIO}",
            "met": ratio <= TARGET_RATIO}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="round trips per round")
    parser.add_argument("--rounds", type=int, default=3, help="best round counts")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = asyncio.run(main_async(args.n, args.rounds))
    if args.json:
        print(json.dumps(result))
        return
    for name in ("three_calls", "exchange"):
        print(f"{name:<12} {result['calls'][name]} call(s)  p50 {result[name]['p50_ms']:8.2f} ms"
              f"  p99 {result[name]['p99_ms']:8.2f} ms")
    print(f"exchange / three calls, p50: {result['ratio_p50']}"
          f" (target {result['target']}: {'met' if result['met'] else 'not met'})")


if __name__ == "__main__":
    main()
