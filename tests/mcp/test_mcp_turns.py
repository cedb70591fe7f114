"""The tools that save an agent turns, through real `bus mcp` processes and the SDK's client.

exchange (a question and its answer in one call), publish_many, poll with
ack_through, the channel and dead-letter tools, cursor_reset, and the
compact text beside each structured result.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from bus import Bus
from tests.mcp.test_mcp import call
from tests.mcp.test_mcp import connected
from tests.mcp.test_mcp import refusal
from tests.mcp.test_mcp import rows


def test_mcp_exchange_is_answered_by_a_second_session_in_one_call(bus: Bus, db_path: Path):
    async def answer_one(bob) -> dict:
        question = (await call(bob, "poll", wait_seconds=60))["messages"][0]
        await call(bob, "publish", type="answer", to=question["from"],
                   payload={"sum": question["payload"]["a"] + 1}, in_reply_to=question["id"])
        return question

    async def answer_with_reply(bob) -> dict:
        question = (await call(bob, "poll", wait_seconds=60))["messages"][0]
        return await call(bob, "reply", seq=question["seq"], type="answer", payload="yes")

    async def scenario():
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            answering = asyncio.create_task(answer_one(bob))
            asked = await alice.call_tool("exchange", {"to": "bob", "type": "question",
                                                       "payload": {"a": 41},
                                                       "wait_seconds": 60})
            question = await answering
            unanswered = await call(alice, "exchange", to="bob", type="question",
                                    wait_seconds=0.2)
            await call(bob, "ack", seq=unanswered["sent"]["seq"])
            replying = asyncio.create_task(answer_with_reply(bob))
            replied = await call(alice, "exchange", to="bob", type="question", wait_seconds=60)
            not_mine = await refusal(bob, "reply", seq=replied["reply"]["seq"], type="answer")
            return asked, question, unanswered, replied, await replying, not_mine

    asked, question, unanswered, replied, reply, not_mine = asyncio.run(scenario())
    got = asked.structured_content
    assert not asked.is_error and not got["timed_out"] and got["acked"]
    assert got["reply"]["payload"] == {"sum": 42} and got["reply"]["from"] == "bob"
    assert got["reply"]["in_reply_to"] == question["id"] == got["sent"]["id"]
    assert got["reply"]["seq"] == 2  # and alice's cursor moved past it (acked)
    assert unanswered["timed_out"] and "reply" not in unanswered  # null: left out
    assert not unanswered["acked"]
    assert replied["reply"]["payload"] == "yes" and replied["acked"]
    assert rows(bus, "SELECT agent_id, last_acked_seq FROM cursors WHERE agent_id = 'alice'") == [
        ("alice", replied["reply"]["seq"])]
    assert replied["reply"]["in_reply_to"] == replied["sent"]["id"]
    assert reply["messages"] == [] and reply["cursor"] == replied["sent"]["seq"]  # acked
    assert (not_mine["code"], not_mine["argument"]) == ("invalid_argument", "seq")


def test_mcp_exchange_does_not_ack_past_a_message_waiting_before_the_reply(
        bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "alice") as alice:
            waiting = asyncio.create_task(call(alice, "exchange", to="bob", type="question",
                                               wait_seconds=60))
            while not bus.list_messages():  # the question is in the file
                await asyncio.sleep(0.01)
            question = bus.list_messages()[0]
            bus.publish("carol", "note", to="alice")  # unrelated, before the answer
            bus.publish("bob", "answer", to="alice", in_reply_to=question.id)
            return await waiting, await call(alice, "poll")

    asked, inbox = asyncio.run(scenario())
    assert asked["reply"]["type"] == "answer" and not asked["acked"]
    assert [m["type"] for m in inbox["messages"]] == ["note", "answer"]


def test_mcp_publish_many_writes_all_or_nothing(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "planner") as client:
            refused = await refusal(client, "publish_many", messages=[
                {"type": "a", "to": "w1"}, {"type": "b", "to": "not ok!"}])
            written = await call(client, "publish_many", messages=[
                {"type": "a", "to": "w1", "payload": {"n": 1}}, {"type": "b"}])
            return refused, written

    refused, written = asyncio.run(scenario())
    assert (refused["code"], refused["argument"]) == ("invalid_argument", "messages[1].to")
    assert [p["seq"] for p in written["published"]] == [1, 2]
    assert rows(bus, "SELECT seq, from_agent, to_agent, type FROM messages") == [
        (1, "planner", "w1", "a"), (2, "planner", None, "b")]


def test_mcp_poll_acks_through_and_reads_in_one_call_and_cursor_reset_rewinds(
        bus: Bus, db_path: Path):
    for n in range(3):
        bus.publish("boss", "job", {"n": n}, to="w1")

    async def scenario():
        async with connected(db_path, "w1") as client:
            first = await call(client, "poll", limit=2)
            second = await call(client, "poll", ack_through=first["messages"][-1]["seq"])
            rewound = await call(client, "cursor_reset", seq=0)
            again = await call(client, "poll")
            skipped = await call(client, "cursor_reset")
            empty = await call(client, "poll")
            return first, second, rewound, again, skipped, empty

    first, second, rewound, again, skipped, empty = asyncio.run(scenario())
    assert [m["seq"] for m in first["messages"]] == [1, 2]
    assert [m["seq"] for m in second["messages"]] == [3] and second["cursor"] == 2
    assert rewound == {"cursor": 0} and [m["seq"] for m in again["messages"]] == [1, 2, 3]
    assert skipped == {"cursor": 3} and empty["messages"] == []
    assert rows(bus, "SELECT agent_id, last_acked_seq FROM cursors") == [("w1", 3)]


def test_mcp_channel_tools_create_join_list_and_dead_letters_replay(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "boss") as boss, connected(db_path, "w1") as w1:
            created = await call(boss, "channel_create", name="jobs", type="direct",
                                 max_retries=0, ack_timeout_seconds=0.05)
            joined = await call(w1, "channel_join", channel="jobs")
            listed = await call(w1, "channel_list")
            await call(boss, "channel_send", channel="jobs", type="command", content="resize")
            taken = await call(w1, "channel_receive", channel="jobs")
            deadline = time.monotonic() + 60
            dead = await call(w1, "dlq_list")
            while not dead["dead_letters"] and time.monotonic() < deadline:
                bus.channels.tick()  # the unacknowledged delivery runs out of retries
                dead = await call(w1, "dlq_list")
            replayed = await call(w1, "dlq_replay", id=dead["dead_letters"][0]["id"])
            again = await call(w1, "channel_receive", channel="jobs")
            return created, joined, listed, taken, dead, replayed, again

    created, joined, listed, taken, dead, replayed, again = asyncio.run(scenario())
    assert (created["name"], created["owner"], created["max_retries"]) == ("jobs", "boss", 0)
    assert joined == {"channel": "jobs", "agent": "w1", "role": "member"}
    assert [c["name"] for c in listed["channels"]] == ["jobs"]
    assert [m["content"] for m in taken["messages"]] == ["resize"]
    assert [(d["recipient"], d["message"]["content"]) for d in dead["dead_letters"]] == [
        ("w1", "resize")]
    assert replayed["recipient"] == "w1"
    assert [m["content"] for m in again["messages"]] == ["resize"]


def test_mcp_text_beside_the_result_is_a_summary_line_then_compact_bodies(
        bus: Bus, db_path: Path):
    bus.publish("boss", "job", {"n": 1}, to="w1")
    bus.publish("boss", "job", {"n": 2}, to="w1")

    async def scenario():
        async with connected(db_path, "w1") as client:
            return await client.call_tool("poll", {})

    polled = asyncio.run(scenario())
    lines = polled.content[0].text.split("\n")
    assert lines[0] == "poll: 2 messages, cursor=0"
    assert [json.loads(line) for line in lines[1:]] == polled.structured_content["messages"]
    assert all("\n" not in line and ": " not in line for line in lines[1:])  # no indentation
