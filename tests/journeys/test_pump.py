"""The pump: a person's own organism runs on the bus, from the installed wheel.

They write an organism.yaml and a handler module in a directory of their
own, put it on the pump's PYTHONPATH, run `bus pump run`, and talk to it with
`bus pump send --wait`: a good request is answered, a bad one gets a `<huh>`,
a request whose handler kills the pump becomes a dead letter that `bus pump
dead` lists, a handler they edit is answering with its new code after a signed
`bus pump oob send hot-reload`, and a SIGTERM stops the pump cleanly, which
`bus status` shows.

The journey runs once (a module fixture, acting only through the installed
commands); each test checks one thing a person would look at.
"""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ORGANISM = """\
name: journey
listeners:
  - name: calculator
    root_tag: add
    payload: journey_tools:Add
    handler: journey_tools:add
    timeout: 5
  - name: crasher             # its handler kills the pump: one try, then a dead letter
    root_tag: crash
    payload: journey_tools:Crash
    handler: journey_tools:crash
    max_attempts: 1
oob:                          # `bus pump oob keygen` writes the key pair there
  authorized_keys: [.worker-state/oob_ed25519.pub]
"""

HANDLERS = '''\
"""The journey's handlers, in the user's own module (not in the wheel)."""

import os
import signal
from dataclasses import dataclass

from bus.pump import Context, Reply
from bus.xml import xmlify


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers."""

    a: float
    b: float


@xmlify(root="sum")
@dataclass
class Sum:
    """The sum of an <add>."""

    value: float


@xmlify(root="crash")
@dataclass
class Crash:
    """Kill the pump that handles it."""

    why: str


def add(msg: Add, ctx: Context) -> Reply:
    return Reply(Sum(msg.a + msg.b))


def crash(msg: Crash, ctx: Context) -> Reply:
    os.kill(os.getpid(), signal.SIGKILL)
'''

WAIT_S = 60  # the longest any step may take on a loaded machine; never a sleep
HUH_EXIT = 3  # `bus pump send --wait` when the reply is a <huh>


@dataclass(frozen=True)
class Journey:
    """What each command of the journey printed, and the directory it ran in."""

    scratch: Path
    answered: subprocess.CompletedProcess[str]
    refused: subprocess.CompletedProcess[str]
    crashed_pump: subprocess.CompletedProcess[str]
    buried: subprocess.CompletedProcess[str]
    dead: subprocess.CompletedProcess[str]
    status_running: subprocess.CompletedProcess[str]
    reloaded: subprocess.CompletedProcess[str]
    reanswered: subprocess.CompletedProcess[str]
    stopped_pump: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def journey(installed, tmp_path_factory: pytest.TempPathFactory) -> Journey:
    scratch = tmp_path_factory.mktemp("organism")
    (scratch / "organism.yaml").write_text(ORGANISM)
    (scratch / "journey_tools.py").write_text(HANDLERS)
    # As a user runs their own handlers: their directory on the pump's path.
    env = installed.env(PYTHONPATH=str(scratch))
    started: list[subprocess.Popen[str]] = []

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return installed.run(*argv, cwd=scratch, env=env)

    def start(*argv: str) -> subprocess.Popen[str]:
        process = installed.popen(*argv, cwd=scratch, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        started.append(process)
        return process

    def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        out, err = process.communicate(timeout=WAIT_S)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    try:
        assert run("bus", "init").returncode == 0
        assert run("bus", "pump", "oob", "keygen").returncode == 0
        checked = run("bus", "pump", "organism", "check", "organism.yaml")
        assert checked.returncode == 0, checked.stderr
        # A short lease, so the unit the crash leaves behind expires soon after it.
        first = start("bus", "pump", "run", "organism.yaml", "--lease-ms", "1000", "-v")
        answered = run("bus", "pump", "send", "organism.yaml", "<add><a>1.5</a><b>2</b></add>",
                       "--to", "calculator", "--wait", "--timeout", str(WAIT_S))
        refused = run("bus", "pump", "send", "organism.yaml", "<add><a>one</a><b>2</b></add>",
                      "--to", "calculator", "--wait", "--timeout", str(WAIT_S))
        crash = start("bus", "pump", "send", "organism.yaml", "<crash><why>poison</why></crash>",
                      "--wait", "--timeout", str(2 * WAIT_S))
        crashed_pump = finish(first)
        # The restarted pump finds the crash's unit out of attempts: a dead letter.
        second = start("bus", "pump", "run", "organism.yaml", "-v")
        buried = finish(crash)
        dead = run("bus", "pump", "dead", "organism.yaml", "--json")
        status_running = run("bus", "status", "--json")
        # They change their handler, and the running pump takes the new code.
        (scratch / "journey_tools.py").write_text(
            HANDLERS.replace("Sum(msg.a + msg.b)", "Sum(msg.a + msg.b + 100)"))
        reloaded = run("bus", "pump", "oob", "send", "hot-reload", "--key",
                       ".worker-state/oob_ed25519", "--json")
        reanswered = run("bus", "pump", "send", "organism.yaml", "<add><a>1.5</a><b>2</b></add>",
                         "--to", "calculator", "--wait", "--timeout", str(WAIT_S))
        second.send_signal(signal.SIGTERM)
        stopped_pump = finish(second)
        return Journey(scratch, answered, refused, crashed_pump, buried, dead, status_running,
                       reloaded, reanswered, stopped_pump)
    finally:
        for process in started:  # only if a step above failed
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_a_request_is_answered(journey: Journey) -> None:
    assert journey.answered.returncode == 0, journey.answered.stderr
    assert journey.answered.stdout.strip() == "calculator -> console: <sum><value>3.5</value></sum>"


def test_a_bad_request_gets_a_huh_that_says_what_is_wrong(journey: Journey) -> None:
    assert journey.refused.returncode == HUH_EXIT, journey.refused.stderr
    reply = journey.refused.stdout
    assert reply.startswith("calculator -> console: <huh code=\"payload-invalid\"")
    assert "'one' is not a valid value" in reply


def test_a_request_that_kills_the_pump_becomes_a_listed_dead_letter(journey: Journey) -> None:
    assert journey.crashed_pump.returncode == -signal.SIGKILL
    # Its sender, still waiting, is told once the next pump gives up on it.
    assert journey.buried.returncode == HUH_EXIT, journey.buried.stderr
    assert journey.buried.stdout.startswith("crasher -> console: <huh code=\"dead-letter\"")
    assert "the listener's handler was tried once and never finished" in journey.buried.stdout
    assert journey.dead.returncode == 0, journey.dead.stderr
    (letter,) = [json.loads(line) for line in journey.dead.stdout.splitlines()]
    assert (letter["listener"], letter["sender"], letter["attempts"], letter["outcome"]) == (
        "crasher", "console", 1, "dead")
    pump = json.loads(journey.status_running.stdout)["pump"]
    assert (pump["organisms"], pump["dead"]) == (["journey"], 1)


def test_a_handler_edited_on_disk_answers_with_its_new_code_after_a_hot_reload(
        journey: Journey) -> None:
    assert journey.reloaded.returncode == 0, journey.reloaded.stderr
    assert json.loads(journey.reloaded.stdout)["result"]["reimported"] == ["journey_tools"]
    assert journey.reanswered.returncode == 0, journey.reanswered.stderr
    assert journey.reanswered.stdout.strip() == (
        "calculator -> console: <sum><value>103.5</value></sum>")


def test_sigterm_stops_the_pump_cleanly(journey: Journey) -> None:
    stopped = journey.stopped_pump
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "pump journey: resumed; 1 dead, 1 replied"
    assert "Traceback" not in stopped.stderr


def pump_agent(status: dict) -> dict:
    (agent,) = [a for a in status["agents"] if a["agent"] == "pump:journey"]
    return agent


def test_the_running_pump_is_alive_in_status(journey: Journey) -> None:
    assert journey.status_running.returncode == 0, journey.status_running.stderr
    agent = pump_agent(json.loads(journey.status_running.stdout))
    assert (agent["state"], agent["status"]) == ("alive", "working")


def test_status_shows_the_stopped_pump_stopped(journey: Journey, installed) -> None:
    shown = installed.run("bus", "status", "--json", cwd=journey.scratch)
    assert shown.returncode == 0, shown.stderr
    assert pump_agent(json.loads(shown.stdout))["state"] == "stopped"
    text = installed.run("bus", "status", cwd=journey.scratch)
    assert text.returncode == 0, text.stderr
    (line,) = [line for line in text.stdout.splitlines() if "pump:journey" in line]
    assert "stopped" in line.split()
