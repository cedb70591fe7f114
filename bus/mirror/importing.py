"""Messages published on JetStream brought into the log, once each, by id.

Processes on other hosts publish to the subjects `--import` names, with the
headers `Bus-From` and `Bus-Type` (and `Bus-To` for a direct message); the
body is the payload's JSON. They land in the stream `<NAME>_import`, and a
durable consumer (`agentbus-import`) hands them to `Bus.publish`, the log's
one write path. The message id is `Nats-Msg-Id` when it is a UUID, else a
UUID derived from it (or from the stream sequence when there is none), so a
message delivered twice, or sent twice, is one message in the log. Each is
acked on JetStream only after its commit: a crash in between redelivers it,
and the id makes the redelivery a no-op.
"""

from __future__ import annotations

import asyncio
import uuid

import nats.errors
import orjson
from nats.js.api import AckPolicy
from nats.js.api import ConsumerConfig

from bus.storage.errors import ValidationFailed
from bus.log.messages import validate_message_id
from bus.mirror import subjects as naming
from bus.mirror.jetstream import ACK_TIMEOUT_S
from bus.mirror.jetstream import JetStreamMirror
from bus.mirror.jetstream import ensure_stream

CONSUMER = "agentbus-import"
FETCH = 256
FETCH_WAIT_S = 0.2
_ID_NAMESPACE = uuid.UUID("6f1c2a57-0e0b-4d5e-9a43-5b1f4f0c9d2e")  # ours: ids of imported messages


def import_stream_name(stream: str) -> str:
    return f"{stream}_import"


def imported_id(stream: str, msg_id: str | None, stream_seq: int) -> str:
    """The bus id of an imported message: its Nats-Msg-Id if a UUID, else one derived from it."""
    if msg_id:
        try:
            return validate_message_id(msg_id)
        except ValidationFailed:
            return str(uuid.uuid5(_ID_NAMESPACE, f"{stream}:{msg_id}"))
    return str(uuid.uuid5(_ID_NAMESPACE, f"{stream}#{stream_seq}"))


class Importer:
    """Consumes `subjects` from JetStream into the log of the mirror's bus."""

    def __init__(self, mirror: JetStreamMirror, subjects: list[str]) -> None:
        self.mirror, self.subjects = mirror, subjects
        self.stream = import_stream_name(mirror.stream)
        self._sub = None

    async def start(self) -> None:
        """Create (or check) the import stream and bind its durable consumer."""
        js = self.mirror.js
        await ensure_stream(js, self.stream, self.subjects, self.mirror.replicas, "import")
        await js.add_consumer(self.stream, ConsumerConfig(
            durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_TIMEOUT_S * 3))
        self._sub = await js.pull_subscribe_bind(CONSUMER, self.stream)

    async def import_once(self) -> int:
        """Bring in what waits (up to FETCH); return how many were handled."""
        try:
            fetched = await self._sub.fetch(FETCH, timeout=FETCH_WAIT_S)
        except nats.errors.TimeoutError:
            return 0
        for msg in fetched:
            await self._import(msg)
        return len(fetched)

    async def run(self, until_caught_up: bool = False) -> None:
        while not self.mirror.stopping.is_set():
            try:
                handled = await self.import_once()
            except (nats.errors.Error, asyncio.TimeoutError):  # reconnecting: fetch again
                await asyncio.sleep(FETCH_WAIT_S)
                continue
            if handled == 0 and until_caught_up:
                return

    async def _import(self, msg) -> None:
        progress = self.mirror.progress
        headers = msg.headers or {}
        sequence = msg.metadata.sequence.stream
        try:
            payload = orjson.loads(msg.data) if msg.data else None
            sender, kind = headers.get(naming.BUS_FROM), headers.get(naming.BUS_TYPE)
            if not sender or not kind:
                raise ValidationFailed("headers", "Bus-From and Bus-Type are required")
            result = await asyncio.to_thread(
                self.mirror.bus.publish, sender, kind, payload, to=headers.get(naming.BUS_TO),
                id=imported_id(self.stream, headers.get(naming.MSG_ID), sequence))
        except (ValidationFailed, orjson.JSONDecodeError) as exc:
            # Never importable as it is: no redelivery, and the reason is kept.
            progress.import_refused.append(f"{self.stream} #{sequence}: {exc}")
            await msg.term()
            return
        if result.duplicate:
            progress.import_duplicates += 1
        else:
            progress.imported += 1
        await msg.ack()  # after the commit: a crash before it redelivers, and the id dedups
