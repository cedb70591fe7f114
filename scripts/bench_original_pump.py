"""The echo workload of scripts/bench_pump.py through the original in-memory pump.

Runs under the Python of a venv that holds xml-pipeline 0.4.0 (bench_pump.py
--original makes it); it imports nothing of agentbus. The organism is the
package's README quick start: `bootstrap("organism.yaml")`, then `pump.run()`.
The only way in is `pump.inject(pump._wrap_in_envelope(...))`: a request
<Add> to `calculator`, whose handler answers with a <Sum> to `collector`,
whose handler counts it (the original has no client to answer: a listener
stands in for it).

    python scripts/bench_original_pump.py --count 2000 --trips 300

Prints one JSON line: {"per_s": requests answered per second, all injected at
once, "p50_ms", "p99_ms": one request at a time, inject to collected}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

MODULE = '''
from dataclasses import dataclass

from third_party.xmlable import xmlify
from xml_pipeline.message_bus.message_state import HandlerResponse

COLLECTED = []  # an asyncio.Queue, set by the benchmark


@xmlify
@dataclass
class Add:
    a: float
    b: float


@xmlify
@dataclass
class Sum:
    value: float


async def add(payload, metadata):
    return HandlerResponse(payload=Sum(value=payload.a + payload.b), to="collector")


async def collect(payload, metadata):
    COLLECTED[0].put_nowait(payload.value)
'''
ORGANISM = """\
organism:
  name: bench
listeners:
  - name: calculator
    payload_class: bench_original_tools.Add
    handler: bench_original_tools.add
    description: Adds two numbers
  - name: collector
    payload_class: bench_original_tools.Sum
    handler: bench_original_tools.collect
    description: Stands in for the client
"""


async def measure(count: int, trips: int) -> dict:
    from xml_pipeline.message_bus import bootstrap

    import bench_original_tools as tools
    collected: asyncio.Queue = asyncio.Queue()
    tools.COLLECTED.append(collected)
    with contextlib.redirect_stdout(io.StringIO()):  # bootstrap prints what it set up
        pump = await bootstrap("organism.yaml")
    runner = asyncio.create_task(pump.run())

    async def send() -> None:
        envelope = pump._wrap_in_envelope(tools.Add(a=1.5, b=2.0), "console", "calculator",
                                          str(uuid.uuid4()))
        await pump.inject(envelope, thread_id=str(uuid.uuid4()), from_id="console")

    await send()  # warm up
    assert await asyncio.wait_for(collected.get(), 30) == 3.5
    start = time.perf_counter()
    for _ in range(count):
        await send()
    for _ in range(count):
        await asyncio.wait_for(collected.get(), 60)
    per_s = count / (time.perf_counter() - start)
    latencies = []
    for _ in range(trips):
        start = time.perf_counter()
        await send()
        await asyncio.wait_for(collected.get(), 30)
        latencies.append((time.perf_counter() - start) * 1000)
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    latencies.sort()
    return {"per_s": per_s, "p50_ms": statistics.median(latencies),
            "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--trips", type=int, default=300)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-original-"))
    (workdir / "bench_original_tools.py").write_text(MODULE)
    (workdir / "organism.yaml").write_text(ORGANISM)
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    print(json.dumps(asyncio.run(measure(args.count, args.trips))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
