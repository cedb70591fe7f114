"""The team: four workers on one git repository, to their ends, then every view on that file.

Built once for the module, through the installed `worker`, `bus` and `git`
only, in the repository (the bus is the default `.worker-state/bus.db`):

- w1 and w2 both change `shared.txt`. w1 merges first; w2's merge conflicts,
  so w2 goes back to work (`worker rework`), merges main into its branch,
  resolves and is merged.
- w3 runs its task under `worker run` with a short lease and is killed with
  SIGKILL mid-task. Spawning w4 for the same task is refused while w3's lease
  holds; once it runs out, w4 takes the task over (its second attempt), is
  rejected once in review, fixes it and is merged. w3 is marked failed.
- w1, w2 and w4 read their inbox (`bus poll`, `bus ack`). Then the finished
  workers are cleaned up (`worker cleanup --finished --branches`, refused for
  the file w3 left uncommitted, then with `--force`) and the log is exported.

Then each test runs one read command on that file and checks what a person
would look at.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from tests.journeys.conftest import Installed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT_S = 60.0  # how long a condition may take on a loaded machine (never a fixed sleep)
SHORT_LEASE_MS = 3000  # w3's lease: long enough to be seen held, short enough to run out soon
BEAT_S = 0.2
FINAL_STATES = {"w1": "COMPLETED", "w2": "COMPLETED", "w3": "FAILED", "w4": "COMPLETED"}
TASKS = {"w1": "colour-blue", "w2": "colour-red", "w3": "primes", "w4": "primes"}
READERS = ("w1", "w2", "w4")  # the workers that read their inbox, so have a cursor
CHROMIUM = shutil.which("chromium")
TMUX = shutil.which("tmux")



def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def commit(worktree: Path, name: str, text: str, message: str) -> None:
    (worktree / name).write_text(text)
    git(worktree, "add", name)
    git(worktree, "commit", "-q", "-m", message)


@dataclass
class Team:
    """The installed commands, run in the team's repository as a person would."""

    installed: Installed
    repo: Path
    scratch: Path
    refusals: list[str] = field(default_factory=list)  # w4's spawns refused while w3's lease held
    cleanup_refusal: subprocess.CompletedProcess[str] | None = None  # w3 left a file behind
    cleaned: list[dict[str, Any]] = field(default_factory=list)  # what cleanup --force removed
    exported: dict[str, Any] = field(default_factory=dict)  # what the last step's export said

    @property
    def db(self) -> Path:
        return self.repo / ".worker-state" / "bus.db"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.installed.run(*argv, cwd=self.repo, timeout=timeout)

    def ok(self, *argv: str) -> str:
        done = self.run(*argv)
        assert done.returncode == 0, (f"{' '.join(argv)} exited {done.returncode}:\n"
                                      f"{done.stdout}{done.stderr}")
        return done.stdout

    def json(self, *argv: str) -> Any:
        return json.loads(self.ok(*argv))

    def json_lines(self, *argv: str) -> list[Any]:
        return [json.loads(line) for line in self.ok(*argv).splitlines()]

    def sql(self, query: str) -> list[dict[str, Any]]:
        return self.json("bus", "sql", "--json", query)

    def worker(self, name: str) -> dict[str, Any]:
        (found,) = self.json_lines("worker", "status", name, "--json")
        return found


def make_repo(repo: Path) -> None:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Journey")
    git(repo, "config", "user.email", "journey@example.com")
    (repo / "README.md").write_text("A repository for the team journey.\n")
    git(repo, "add", "README.md")
    commit(repo, "shared.txt", "colour: grey\n", "initial")


def read_inbox(team: Team, worker: str) -> None:
    """What an agent does first: read its messages, find its task, acknowledge them."""
    messages = team.json_lines("bus", "poll", "--agent", worker, "--json")
    assert any(m["type"] == "task_assign" and m["to"] == worker for m in messages), messages
    team.ok("bus", "ack", "--agent", worker, "--seq", str(messages[-1]["seq"]))


def spawn(team: Team, worker: str, task: str) -> Path:
    spawned = team.json("worker", "spawn", "--task", task, "--worker", worker, "--json")
    assert spawned["state"] == "ASSIGNED" and spawned["branch"] == f"{worker}/{task}"
    return Path(spawned["worktree"])


def work_and_submit(team: Team, worker: str, worktree: Path, name: str, text: str) -> None:
    read_inbox(team, worker)
    assert team.json("worker", "start", worker, "--json")["state"] == "WORKING"
    team.ok("worker", "heartbeat", worker, "--progress", "0.5")
    commit(worktree, name, text, f"{worker}: {name}")
    team.ok("worker", "done", worker, "--message", f"{name} written")


def approve_and_merge(team: Team, worker: str) -> subprocess.CompletedProcess[str]:
    team.ok("worker", "approve", worker)
    return team.run("worker", "merge", worker)


def kill_mid_task(team: Team, worker: str, worktree: Path) -> None:
    """`worker run` in its own session, SIGKILLed once its task is under way."""
    task = "echo 2 3 5 7 > primes.txt; exec sleep 600"  # the task never finishes by itself
    run = team.installed.popen("worker", "run", worker, "--interval", str(BEAT_S),
                               "--lease-ms", str(SHORT_LEASE_MS), "--", "sh", "-c", task,
                               cwd=team.repo, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (worktree / "primes.txt").exists()
                   and team.worker(worker)["heartbeat_age_s"] is not None,
                   f"{worker}'s task to start and beat")
        assert team.worker(worker)["state"] == "WORKING"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=WAIT_S)


def take_over(team: Team, dead: str, successor: str, task: str) -> tuple[Path, list[str]]:
    """Spawn `successor` for the dead worker's task as soon as its lease lets us."""
    refusals: list[str] = []

    def spawned() -> bool:
        done = team.run("worker", "spawn", "--task", task, "--worker", successor)
        if done.returncode != 0:
            refusals.append(done.stderr)
        return done.returncode == 0

    wait_until(spawned, f"{dead}'s lease on {task} to run out")
    started = team.json("worker", "start", successor, "--json")
    assert started["state"] == "WORKING"
    return Path(started["worktree"]), refusals


@pytest.fixture(scope="module")
def team(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Team:
    base = tmp_path_factory.mktemp("team")
    team = Team(installed, base / "repo", base)
    make_repo(team.repo)
    trees = {w: spawn(team, w, TASKS[w]) for w in ("w1", "w2", "w3")}

    # w1 and w2 change the same line: whoever merges second meets a conflict.
    work_and_submit(team, "w1", trees["w1"], "shared.txt", "colour: blue\n")
    work_and_submit(team, "w2", trees["w2"], "shared.txt", "colour: red\n")

    kill_mid_task(team, "w3", trees["w3"])
    trees["w4"], refusals = take_over(team, "w3", "w4", "primes")
    team.refusals = refusals
    team.ok("worker", "fail", "w3", "--reason", "its process was killed (SIGKILL) mid-task")
    read_inbox(team, "w4")
    commit(trees["w4"], "primes.txt", "2 3 5 7 11 13", "w4: primes.txt")
    team.ok("worker", "done", "w4", "--message", "primes.txt written")

    merged = approve_and_merge(team, "w1")
    assert merged.returncode == 0, merged.stderr
    resolve_conflict(team, "w2", trees["w2"])

    # The reviewer sends w4 back once.
    team.ok("worker", "reject", "w4", "--reason", "primes.txt lacks its final newline")
    commit(trees["w4"], "primes.txt", "2 3 5 7 11 13\n", "w4: final newline")
    team.ok("worker", "done", "w4", "--message", "newline added")
    merged = approve_and_merge(team, "w4")
    assert merged.returncode == 0, merged.stderr

    team.cleanup_refusal = team.run("worker", "cleanup", "--finished", "--branches")
    team.cleaned = team.json_lines("worker", "cleanup", "--finished", "--branches", "--force",
                                   "--json")
    team.exported = team.json("bus", "export", "--json")
    print(f"w4's spawn was refused {len(refusals)} time(s) while w3's lease held")
    return team


def resolve_conflict(team: Team, worker: str, worktree: Path) -> None:
    """The merge conflicts; rework, merge the base in, resolve, and through review again."""
    refused = approve_and_merge(team, worker)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith("Error: ") and "shared.txt" in refused.stderr
    assert f"worker rework {worker}" in refused.stderr  # the error says the way out
    assert team.worker(worker)["state"] == "APPROVED"  # nothing changed
    team.ok("worker", "rework", worker, "--reason", "conflicts with main after w1 merged")
    back = team.worker(worker)
    assert back["state"] == "WORKING" and back["liveness"] != "stopped"  # at work again
    assert git(worktree, "merge", "main", check=False).returncode != 0  # the same conflict
    (worktree / "shared.txt").write_text("colour: purple (blue and red)\n")
    git(worktree, "add", "shared.txt")
    git(worktree, "commit", "-q", "--no-edit")
    team.ok("worker", "done", worker, "--message", "merged main; blue and red make purple")
    merged = approve_and_merge(team, worker)
    assert merged.returncode == 0, merged.stderr


def message_count(team: Team) -> int:
    return team.sql("SELECT count(*) AS n FROM messages")[0]["n"]


def agent_rows(screen: str) -> dict[str, list[str]]:
    """The rows of the agents table (`agent  state  silent  status  task`) on a screen."""
    lines = screen.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["agent", "state"])
    rows = {}
    for line in lines[header + 1:]:
        if not line.strip() or line.split()[0].endswith(":"):  # the table ends
            break
        rows[line.split()[0]] = line.split()
    return rows


def assert_each_agent_stopped(screen: str) -> None:
    """Each worker's last beat says it stopped (it finished), with its task."""
    rows = agent_rows(screen)
    assert set(rows) == set(FINAL_STATES), screen
    for worker, row in rows.items():
        assert row[1] == "stopped" and row[-1] == TASKS[worker], screen


# --- what the team left: git and the workers ----------------------------------------


def test_the_team_merged_its_work_into_main(team: Team) -> None:
    assert (team.repo / "shared.txt").read_text() == "colour: purple (blue and red)\n"
    assert git(team.repo, "show", "main:primes.txt").stdout == "2 3 5 7 11 13\n"
    assert git(team.repo, "status", "--porcelain").stdout == ""  # .worker-state/ is excluded
    for worker in ("w1", "w2", "w4"):
        assert git(team.repo, "merge-base", "--is-ancestor", team.worker(worker)["head_commit"],
                   "main", check=False).returncode == 0, worker


def test_cleanup_removed_every_worktree_and_branch(team: Team) -> None:
    refused = team.cleanup_refusal
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("Error: ") and "worktrees/w3" in refused.stderr
    assert "primes.txt" in refused.stderr and "--force" in refused.stderr
    by_worker = {c["worker"]: c for c in team.cleaned}
    assert {w: c["state"] for w, c in by_worker.items()} == FINAL_STATES
    assert by_worker["w3"]["worktree"] is not None  # a failed worker keeps its worktree till now
    assert all(by_worker[w]["worktree"] is None for w in ("w1", "w2", "w4"))  # gone at merge
    # w3 was killed before it committed: its branch holds nothing main lacks.
    assert {w: c["branch"] for w, c in by_worker.items()} == {w: f"{w}/{TASKS[w]}"
                                                              for w in FINAL_STATES}
    assert all(c["kept_branch"] is None for c in team.cleaned)
    assert git(team.repo, "branch", "--format=%(refname:short)").stdout.split() == ["main"]
    assert git(team.repo, "worktree", "list", "--porcelain").stdout.count("worktree ") == 1


def test_the_successor_waited_for_the_dead_workers_lease(team: Team) -> None:
    for refusal in team.refusals:  # none, if the machine was slow enough for the lease to end
        assert refusal.startswith("Error: task primes is taken: worker w3 (WORKING)"), refusal
    reclaimed = team.sql("SELECT json_extract(payload, '$.task') AS task,"
                         " json_extract(payload, '$.attempt') AS attempt"
                         " FROM messages WHERE type = 'task_claim' AND from_agent = 'w4'"
                         " ORDER BY seq")
    assert reclaimed[0] == {"task": "primes", "attempt": 2}  # the task's second holder
    assert team.sql("SELECT count(*) AS n FROM messages WHERE type = 'task_reclaimed'"
                    ) == [{"n": 1}]


def test_worker_status_shows_each_final_state(team: Team) -> None:
    lines = team.ok("worker", "status").splitlines()
    assert lines[0].split() == ["worker", "task", "state", "branch", "heartbeat", "liveness"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert {w: row[2] for w, row in rows.items()} == FINAL_STATES
    assert rows["w4"][1] == rows["w3"][1] == "primes"
    found = team.json_lines("worker", "status", "--json")
    assert {w["worker"]: w["state"] for w in found} == FINAL_STATES
    assert all(w["liveness"] is None for w in found)  # finished: no liveness to judge
    assert all(w["heartbeat_age_s"] is not None for w in found)  # each one beat


def test_worker_takes_json_anywhere_and_its_errors_follow(team: Team) -> None:
    found = team.json_lines("worker", "--json", "status")
    assert {w["worker"]: w["state"] for w in found} == FINAL_STATES
    for argv in (("worker", "status", "w9", "--json"), ("worker", "--json", "approve", "w1")):
        refused = team.run(*argv)
        assert refused.returncode == 1 and refused.stdout == ""
        assert set(json.loads(refused.stderr)) >= {"error", "field"}, refused.stderr


# --- bus status, consumers, consumer info ----------------------------------------------


def test_status_shows_the_four_workers_in_their_final_states(team: Team) -> None:
    screen = team.ok("bus", "status")
    lines = screen.splitlines()
    table = lines.index("workers: 3 COMPLETED, 1 FAILED")
    shown = {line.split()[0]: line.split()[1:3] for line in lines[table + 2:table + 6]}
    assert shown == {w: [TASKS[w], state] for w, state in FINAL_STATES.items()}
    assert_each_agent_stopped(screen)  # finished, not dead
    assert screen.splitlines()[1].startswith(f"log: {message_count(team)} messages")


def test_status_json_counts_the_workers_and_agents(team: Team) -> None:
    found = team.json("bus", "status", "--json")
    assert found["workers"] == {"COMPLETED": 3, "FAILED": 1}
    assert {w["worker"]: w["state"] for w in found["worker_list"]} == FINAL_STATES
    assert {a["agent"]: a["status"] for a in found["agents"]} == dict.fromkeys(FINAL_STATES,
                                                                                "stopped")
    assert found["log"]["messages"] == message_count(team)
    assert found["claims"]["held"] == 0  # every task released
    assert found["export"]["lag"] == 0


def test_consumers_lists_each_reader_and_the_exporter(team: Team) -> None:
    lines = team.ok("bus", "consumers").splitlines()
    assert lines[0].split()[:3] == ["consumer", "kind", "cursor"]
    kinds = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert kinds == {**dict.fromkeys(READERS, "agent"), "(export)": "exporter"}
    found = {c["agent"]: c for c in team.json_lines("bus", "consumers", "--json")}
    assert found["(export)"]["lag"] == 0
    assert all(found[w]["cursor"] > 0 and found[w]["pending"] > 0 for w in READERS)


def test_consumer_info_shows_one_reader(team: Team) -> None:
    acked = team.sql("SELECT last_acked_seq AS seq FROM cursors WHERE agent_id = 'w1'")[0]["seq"]
    found = team.json("bus", "consumer", "info", "w1", "--json")
    assert found["agent"] == "w1" and found["cursor"] == acked
    assert found["lag"] == message_count(team) - acked
    text = team.ok("bus", "consumer", "info", "w1").splitlines()
    assert text[0] == "consumer w1 (agent)"
    assert text[1] == f"cursor: {acked} (last seq {message_count(team)})"
    unknown = team.run("bus", "consumer", "info", "w9")
    assert unknown.returncode == 2  # a value the bus does not know is a usage error
    assert unknown.stderr.splitlines()[-1] == (
        "Error: Invalid value for 'AGENT': no consumer 'w9' (known: w1, w2, w4, (export));"
        " see `bus consumers`")


# --- the log: tail, sql, search, export ---------------------------------------------------


def test_tail_shows_the_last_merge(team: Team) -> None:
    (last,) = team.json_lines("bus", "tail", "-n", "1", "--json")
    assert (last["from"], last["type"]) == ("w4", "task_merged")
    assert last["payload"]["branch"] == "w4/primes"
    text = team.ok("bus", "tail", "-n", "3").splitlines()
    assert len(text) == 3 and "task_merged" in text[-1] and "w4" in text[-1]


def test_sql_reads_the_workers_and_their_story(team: Team) -> None:
    rows = team.sql("SELECT worker_id, task_id, state FROM workers ORDER BY worker_id")
    assert [(r["worker_id"], r["state"]) for r in rows] == sorted(FINAL_STATES.items())
    commands = team.sql("SELECT json_extract(payload, '$.command') AS command FROM messages"
                        " WHERE type = 'state_change' AND from_agent = 'w2' ORDER BY seq")
    assert [c["command"] for c in commands] == [
        "spawn", "start", "done", "approve", "rework", "done", "approve", "merge"]
    csv = team.ok("bus", "sql", "--csv", "SELECT worker_id, state FROM workers ORDER BY 1")
    assert csv.splitlines()[0] == "worker_id,state" and csv.splitlines()[4] == "w4,COMPLETED"
    refused = team.run("bus", "sql", "DELETE FROM messages")
    assert refused.returncode == 1 and "read-only" in refused.stderr


def test_search_finds_the_kill_and_the_review(team: Team) -> None:
    team.ok("bus", "search", "--enable")
    (killed,) = team.json_lines("bus", "search", "SIGKILL", "--json")
    assert (killed["from"], killed["type"]) == ("w3", "task_failed")
    (review,) = team.json_lines("bus", "search", "newline", "--type", "review_result", "--json")
    assert review["to"] == "w4" and review["payload"]["approved"] is False
    assert "task_failed" in team.ok("bus", "search", "SIGKILL")


def test_export_wrote_every_message_once(team: Team) -> None:
    path = Path(team.exported["path"])
    assert path == team.db.parent / "bus.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert team.exported["exported"] == len(records) == message_count(team)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    again = team.json("bus", "export", "--json")
    assert again == {"path": str(path), "exported": 0}  # nothing new: nothing appended


# --- the history report in Chromium ---------------------------------------------------------


def chromium_page(playwright, viewport: dict[str, int] | None = None):
    """Headless Chromium that can reach no host but this one; other requests are recorded."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
    page = browser.new_page(viewport=viewport or {"width": 1400, "height": 1300})
    elsewhere: list[str] = []

    def local_only(route) -> None:
        url = route.request.url
        if url.startswith(("file:", "http://127.0.0.1", "data:")):
            route.continue_()
        else:
            elsewhere.append(url)
            route.abort()

    page.route("**/*", local_only)
    return browser, page, elsewhere


# Each trace of a plotly chart: its bars, as (x, y) pairs.
CHART_BARS_JS = """(div) => (div.data || []).map((t) => Array.from(t.x || []).map(
    (x, i) => [String(x), Number((t.y || [])[i])]))"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_history_report_draws_every_chart_offline(team: Team) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    out = team.scratch / "report"
    done = team.run("bus", "history", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"report written to {out / 'report.html'}" in done.stderr.splitlines()
    report = out / "report.html"
    assert b'<script src="http' not in report.read_bytes()  # plotly's JS is in the page
    with sync_api.sync_playwright() as pw:
        browser, page, elsewhere = chromium_page(pw)
        page.goto(report.as_uri())
        charts = page.eval_on_selector_all("div[id^='chart-']", "(ds) => ds.map((d) => d.id)")
        bars = {}
        for chart in charts:
            page.wait_for_function(f"(document.getElementById('{chart}').data || []).length > 0",
                                   timeout=20_000)
            bars[chart] = [bar for trace in page.eval_on_selector(f"#{chart}", CHART_BARS_JS)
                           for bar in trace]
        browser.close()
    assert elsewhere == []
    assert {"chart-volume", "chart-time_in_state", "chart-takeovers"} <= set(bars), charts
    for chart, drawn in bars.items():
        if chart == "chart-thread_latency" and not team.sql("SELECT 1 FROM threads LIMIT 1"):
            continue  # the team ran no pump: no thread to time
        assert any(y > 0 for _, y in drawn), (chart, drawn)
    # Every state the workers went through took time, and the chart shows it.
    in_state = dict(bars["chart-time_in_state"])
    assert {"ASSIGNED", "WORKING", "IN_REVIEW", "APPROVED"} <= set(in_state)
    assert all(y > 0 for y in in_state.values()), in_state
    assert sum(y for _, y in bars["chart-takeovers"]) == 1  # w4 took primes over from w3


# --- bus top in tmux ---------------------------------------------------------------------------


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make test installs it)")
def test_top_shows_each_workers_final_state(team: Team) -> None:
    tmux = [TMUX, "-L", f"team-{os.getpid()}", "-f", "/dev/null"]
    env = team.installed.env()

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True,
                              text=True, env=env, check=True).stdout

    subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "160", "-y", "50",
                    "-c", str(team.repo),
                    f"{team.installed.command('bus')} top; echo EXITED-$?; sleep 600"],
                   env=env, check=True)
    try:
        shown = wait_until(lambda: (lambda s: s if "workers:" in s or "EXITED-" in s else "")(
            screen()), "bus top's first screen")
        assert "EXITED-" not in shown, shown
        assert "workers: 3 COMPLETED, 1 FAILED" in shown, shown
        assert_each_agent_stopped(shown)
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], env=env, check=True)
        wait_until(lambda: "EXITED-0" in screen(), "bus top to quit with status 0")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, env=env)


# --- bus serve in Chromium ------------------------------------------------------------------


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_shows_the_workers_and_no_error(team: Team, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    server = team.installed.popen("bus", "serve", "--port", "0", cwd=team.repo,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = server.stdout.readline()
        assert " at http://" in line, line + server.stderr.read()
        url = line.split(" at ")[1].split()[0]
        last_seq = str(message_count(team))
        with sync_api.sync_playwright() as pw:
            browser, page, elsewhere = chromium_page(pw)
            page.goto(url)
            page.wait_for_function(f"document.body.dataset.lastSeq === '{last_seq}'",
                                   timeout=20_000)
            assert page.text_content("#workers") == "4"
            assert page.get_attribute("#live", "class") != "stale"
            assert page.text_content("#live").startswith("live, as of")
            agents = page.text_content("#agents")
            assert all(worker in agents for worker in FINAL_STATES), agents
            assert "stopped" in agents
            shot = tmp_path / "bus-serve.png"
            page.screenshot(path=str(shot), full_page=True)
            browser.close()
        assert elsewhere == []
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=WAIT_S)
    assert server.returncode == 0
