"""The agentbus demo: agents coordinating on a real bus file, then a history report.

Run with `make demo`. Everything lands in demo/ (git-ignored): the bus
(demo/bus.db), a throwaway git repository (demo/repo) whose branches the
workers commit to, and the export (demo/bus.jsonl).

1. The orchestrator spawns three workers: a branch and a worktree each.
2. Each runs as its own OS process (`worker run`): it takes its task's lease,
   beats from a thread, does a small real task and commits it.
3. One worker is killed mid-task with SIGKILL. Its lease keeps the task
   until it runs out (spawning a replacement is refused until then); then a
   replacement worker takes the task over, and the bus announces it
   (`task_reclaimed`, which the report's dead_tasks query lists).
4. Review: approve (one is rejected first and redone), then merge into main.
5. The message pump runs the example organism (examples/organism.yaml): a
   request is answered, a broadcast races two search tools, a chain ends
   in a final answer, and a <huh> teaches a bad caller.
6. The log is exported to JSONL and the Spark history report runs on it
   (the pump's conversations show up in its `threads` latency table); its
   files, report.html with the charts among them, land in demo/report/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bus import Bus

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"
DB = DEMO / "bus.db"
REPO = DEMO / "repo"
REPORT = DEMO / "report"
TASKS = ROOT / "scripts" / "demo_tasks.py"
ORGANISM = ROOT / "examples" / "organism.yaml"
LEASE_MS = 3000
BEAT_S = 0.2
CLI = {"bus": "bus.cli", "worker": "workers.cli"}


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(DEMO, ignore_errors=True)
    make_repo()
    section("1. The orchestrator spawns three workers, each on its own branch and worktree")
    for worker, task in (("w1", "wordcount"), ("w2", "primes"), ("w3", "fibonacci")):
        cli("worker", "spawn", "--task", task, "--worker", worker, "--repo", str(REPO))
    section("2. Each worker runs as its own OS process: lease, heartbeats, a real task, a commit")
    runs = {w: launch(w, task, slow) for w, task, slow in
            (("w1", "wordcount", 0.5), ("w2", "primes", 60.0), ("w3", "fibonacci", 0.5))}
    for worker in ("w1", "w3"):
        finish(worker, runs[worker])
    with Bus.open(DB, create=False) as bus:
        wait_for(lambda: holder(bus, "primes") == "w2", "w2 to take the primes lease")
        kill_and_reclaim(bus, runs["w2"])
    review_and_merge()
    pump_section()
    section("6. The log goes to JSONL (tail -f demo/bus.jsonl) and Spark reads it")
    cli("bus", "export")
    report = history_report()
    print(f"\nDone in {time.monotonic() - started:.0f} s.")
    if report is not None:
        print(f"The history report: {report.relative_to(ROOT)} (open it in a browser)")
    print(f"Try next:\n"
          f"  tail -f demo/bus.jsonl                 (and `bus --db demo/bus.db export --follow`)\n"
          f"  .venv/bin/bus --db demo/bus.db tail -n 20\n"
          f"  .venv/bin/worker --db demo/bus.db status\n"
          f"  .venv/bin/bus --db demo/bus.db sql \"SELECT type, count(*) FROM messages GROUP BY type\"\n"
          f"  .venv/bin/bus --db demo/bus.db history --query lifecycle\n"
          f"  git -C demo/repo log --graph --oneline --all")
    return 0


def kill_and_reclaim(bus: Bus, run: subprocess.Popen) -> None:
    section("3. w2 is killed mid-task; its lease holds the task until it runs out")
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    print(f"  killed w2 (pid {run.pid}) with SIGKILL while it was computing primes")
    cli("bus", "claims")
    spawn = ("worker", "spawn", "--task", "primes", "--worker", "w4", "--repo", str(REPO))
    refused_at = time.monotonic()
    first = cli(*spawn, check=False)  # refused, naming w2: its lease has not run out
    while first.returncode != 0:
        time.sleep(0.25)
        first = cli(*spawn, check=False, quiet=True)
    print(f"  ... w4 could be spawned {time.monotonic() - refused_at:.1f} s later,"
          " when w2's lease ran out")
    cli("worker", "start", "w4", "--lease-ms", str(LEASE_MS))
    print("  (the bus announces the takeover, task_reclaimed at attempt 2;"
          " the report's dead_tasks lists it)")
    cli("bus", "tail", "-n", "3")
    cli("worker", "fail", "w2", "--reason", "process died (SIGKILL)")
    finish("w4", launch("w4", "primes", 0.0))


def review_and_merge() -> None:
    section("4. Review: w3 is rejected once and redoes its work; then everything merges")
    cli("worker", "reject", "w3", "--reason", "also list the first 80 numbers")
    finish("w3", launch("w3", "fibonacci", 0.0, ["--count", "80"]))
    for worker in ("w1", "w3", "w4"):
        cli("worker", "approve", worker)
        cli("worker", "merge", worker)
    cli("worker", "status")
    cli("worker", "cleanup", "--finished", "--branches")
    show("git", "-C", str(REPO), "log", "--oneline", "--graph", "main")


def pump_section() -> None:
    section("5. The message pump: the example organism answers, races, chains and teaches")
    organism = str(ORGANISM.relative_to(ROOT))
    cli("bus", "pump", "organism", "check", organism)
    print(f"$ bus pump run {organism} &")
    pump = subprocess.Popen(_argv("bus", ["pump", "run", organism]), env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        send = ("bus", "pump", "send", organism)
        cli(*send, "<add><a>1.5</a><b>2</b></add>", "--to", "calculator", "--wait")
        print("  (no --to: every listener of <search> gets it; the fast one answers first)")
        cli(*send, "<search><query>weather</query></search>", "--wait", "--replies", "2")
        print("  (seed 001's chain: greeter calls its peer calculator, whose <sum> comes back"
              " to the greeter, which answers the console)")
        cli(*send, "<greeting><name>Ada</name></greeting>", "--wait")
        print("  (loud: the greeter passes the calculator's answer on to the shouter, whose"
              " <final-answer> ends the conversation)")
        cli(*send, "<greeting><name>Ada</name><loud>true</loud></greeting>", "--wait")
        print("  (a bad caller gets a <huh> that says what to fix; no handler sees the input;"
              " --wait exits 3)")
        cli(*send, "<add><a>one</a><b>2</b></add>", "--to", "calculator", "--wait", check=False)
        cli(*send, "<hot-reload/>", "--wait", check=False)
    finally:
        pump.send_signal(signal.SIGTERM)
        output, _ = pump.communicate(timeout=60)
    for line in output.splitlines():
        print(f"  [pump] {line}")
    print("  (every call chain was pruned as its answers bubbled up: no thread is left open"
          " but the organism's root)")
    cli("bus", "pump", "threads", "--status", "open")
    cli("bus", "pump", "threads", "--limit", "8")


def history_report() -> Path | None:
    """Every query in one Spark session, printed and written to demo/report/."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("  (Java is not installed: Spark needs it; skipping the report)")
        return None
    cli("bus", "history", "--out", str(REPORT.relative_to(ROOT)))
    return REPORT / "report.html"


# --- plumbing -----------------------------------------------------------------------


def make_repo() -> None:
    REPO.mkdir(parents=True)
    for args in (("init", "-q", "-b", "main"), ("config", "user.name", "Demo"),
                 ("config", "user.email", "demo@example.com")):
        subprocess.run(["git", "-C", str(REPO), *args], check=True)
    (REPO / "README.md").write_text("A throwaway repository for the agentbus demo.\n"
                                    "Workers commit their results here, one branch each.\n")
    subprocess.run(["git", "-C", str(REPO), "add", "README.md"], check=True)
    subprocess.run(["git", "-C", str(REPO), "commit", "-q", "-m", "initial"], check=True)


def launch(worker: str, task: str, slow: float, extra: list[str] = ()) -> subprocess.Popen:
    """`worker run` in its own process group, so a kill takes its task process too."""
    argv = ["run", worker, "--interval", str(BEAT_S), "--lease-ms", str(LEASE_MS), "--",
            sys.executable, str(TASKS), task, "--slow", str(slow), *extra]
    print(f"$ worker {' '.join(argv[:6])} -- python demo_tasks.py {task} ...")
    return subprocess.Popen(_argv("worker", argv), start_new_session=True, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(worker: str, run: subprocess.Popen) -> None:
    output, _ = run.communicate(timeout=120)
    for line in output.splitlines():
        print(f"  [{worker}] {line}")
    if run.returncode != 0:
        raise SystemExit(f"demo: worker {worker} failed (exit {run.returncode})")


def cli(program: str, *args: str, check: bool = True, quiet: bool = False):
    if not quiet:
        print(f"$ {program} {' '.join(_quote(a) for a in args)}")
    done = subprocess.run(_argv(program, list(args)), env=_env(), capture_output=True, text=True,
                          cwd=ROOT)
    if not quiet:
        for line in (done.stdout + done.stderr).splitlines():
            print(f"  {line}")
    if check and done.returncode != 0:
        raise SystemExit(f"demo: `{program} {' '.join(args)}` failed (exit {done.returncode})")
    return done


def show(*argv: str) -> None:
    print(f"$ {' '.join(argv)}")
    for line in subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines():
        print(f"  {line}")


def holder(bus: Bus, task: str) -> str | None:
    return next((c.agent for c in bus.claims.list() if c.task_id == task), None)


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: gave up waiting for {what}")
        time.sleep(0.05)


def section(title: str) -> None:
    print(f"\n== {title}")


def _argv(program: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", CLI[program], "--db", str(DB), *args]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def _quote(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


if __name__ == "__main__":
    sys.exit(main())
