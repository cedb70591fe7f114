"""Out-of-band control of a running pump: add-listener, remove-listener and
hot-reload change its routing; a request it cannot apply changes nothing.

The pump runs in a thread of the test process (serving the real OOB socket);
requests are signed with real keys and sent over the socket.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bus import Bus
from bus.pump import Pump
from bus.pump import client
from bus.pump import oob
from bus.pump.organism import load_organism

CALC = ("  - name: calculator\n    root_tag: add\n    payload: tests.support.pump_tools:Add\n"
        "    handler: tests.support.pump_tools:add\n")
CALC_ADD = CALC.replace("name: calculator", "name: calc.add")
SEARCH = {"name": "search.fast", "root_tag": "search", "payload": "tests.support.pump_tools:Search",
          "handler": "tests.support.pump_tools:search_fast"}


def write(path: Path, listeners: str) -> None:
    path.write_text(f"name: org\nlisteners:\n{listeners}"
                    "oob:\n  authorized_keys: [keys/oob_ed25519.pub]\n")


@pytest.fixture
def running(bus: Bus, tmp_path: Path):
    keys = oob.generate_keys(tmp_path / "keys")
    organism = tmp_path / "organism.yaml"
    write(organism, CALC)
    pump = Pump(bus, load_organism(organism))
    thread = threading.Thread(target=pump.run, daemon=True)
    thread.start()
    socket_path = oob.socket_path_for(bus.path)
    deadline = time.monotonic() + 30
    while not socket_path.exists():
        assert time.monotonic() < deadline, "the pump never opened its OOB socket"
        time.sleep(0.01)
    key = oob.load_private_key(keys.private_path)
    yield pump, lambda command, args: oob.send_request(socket_path, key, command, args), organism
    pump.stop()
    thread.join(30)
    assert not thread.is_alive()


def ask(bus: Bus, xml: bytes, to: str | None = None) -> client.Received:
    sent = client.send(bus, "org", xml, to=to)
    got = client.wait_replies(bus, sent, timeout=30)
    assert got, "no reply within 30 s"
    return got[0]


def test_oob_commands_change_the_running_pumps_routing(bus, running):
    pump, control, organism = running
    assert ask(bus, b"<search><query>q</query></search>").root_tag == "huh"

    added = control("add-listener", SEARCH)
    assert added["ok"] and added["result"]["routes"] == {"add": ["calculator"],
                                                         "search": ["search.fast"]}
    reply = ask(bus, b"<search><query>q</query></search>")
    assert (reply.sender, reply.root_tag) == ("search.fast", "result")

    assert control("remove-listener", {"name": "calculator"})["ok"]
    refused = ask(bus, b"<add><a>1</a><b>2</b></add>")
    assert (refused.sender, refused.root_tag) == ("system", "huh")

    write(organism, CALC_ADD)
    reloaded = control("hot-reload", {})
    assert reloaded["ok"] and reloaded["result"]["listeners"] == ["calc.add"]
    assert ask(bus, b"<add><a>1</a><b>2</b></add>", to="calc.add").sender == "calc.add"
    assert [spec.name for spec in pump.organism.listeners] == ["calc.add"]


def test_an_oob_change_the_pump_cannot_run_changes_nothing(bus, running):
    pump, control, _ = running
    wrong_tag = dict(SEARCH, root_tag="find")  # the payload class is <search>
    response = control("add-listener", wrong_tag)
    assert (response["ok"], response["error"]) == (False, "failed")
    assert "listeners[1].root_tag" in response["message"]
    assert list(pump.table.routes.listeners) == ["calculator"]
    assert control("remove-listener", {"name": "nobody"})["ok"] is False
    assert ask(bus, b"<add><a>1</a><b>2</b></add>").sender == "calculator"
