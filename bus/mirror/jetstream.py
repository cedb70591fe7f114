"""The mirror: the log published to a JetStream stream in seq order, exactly once.

    async with JetStreamMirror(bus, "nats://127.0.0.1:4222", "BUS") as mirror:
        await mirror.run(until_caught_up=True)

Exactly once across crashes, without trusting the mirror's own bookkeeping:
at start (and after any failed publish) the mirror reads the stream's last
message, and resumes after its `Bus-Seq`. Each publish carries the message
id as `Nats-Msg-Id` (JetStream drops a repeat inside its duplicate window)
and `Nats-Expected-Last-Msg-Id`, the id of the message before it, so the
stream refuses any message that would not follow the last one stored: a
second mirror, or one resuming from a stale position, cannot interleave or
duplicate. The position is also kept as the cursor `mirror:nats:<stream>`,
so `bus consumers` shows the mirror's lag like any consumer's.

A lost connection is nats-py's to recover (it reconnects for ever); a batch
not acknowledged meanwhile times out and is sent again from the stream's
position once the server answers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from dataclasses import field

import nats
import nats.errors
import orjson
from nats.js.api import StreamConfig
from nats.js.errors import APIError
from nats.js.errors import NoStreamResponseError
from nats.js.errors import NotFoundError

from bus.api import Bus
from bus.log.messages import Message
from bus.mirror import subjects as naming
from bus.mirror.errors import JetStreamUnavailable
from bus.mirror.errors import NatsUnreachable
from bus.mirror.errors import StreamMismatch
from bus.mirror.errors import StreamOfAnotherBus
from bus.mirror.errors import SubjectsTaken

log = logging.getLogger("bus.mirror")
BATCH = 500  # messages in flight at once (publish_async, one ack each)
ACK_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 2.0
WAIT_S = 0.5  # the longest a quiet mirror waits before looking at the log again
RETRY_MAX_S = 2.0
ELECTION_S = 30.0  # how long a cluster may take to elect a leader before the mirror gives up
KIND = "agentbus"  # the stream's metadata says what made it
_SUBJECTS_OVERLAP = 10065  # JetStream's err_code: subjects overlap with an existing stream
# What a publish or a lookup may meet while a stream's leader is lost or not yet elected
# (a new R3 stream on a busy machine answers "no response from stream" for a moment).
_JS_ERRORS = (APIError, NoStreamResponseError, nats.errors.NoRespondersError,
              nats.errors.TimeoutError, asyncio.TimeoutError)


@dataclass
class MirrorProgress:
    """What a run did: `position` is the last seq the stream holds."""

    stream: str
    position: int = 0
    published: int = 0
    resumed_from: int = 0
    retries: int = 0
    imported: int = 0
    import_duplicates: int = 0
    import_refused: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, object]:
        return {"stream": self.stream, "position": self.position, "published": self.published,
                "resumed_from": self.resumed_from, "retries": self.retries,
                "imported": self.imported, "import_duplicates": self.import_duplicates,
                "import_refused": len(self.import_refused)}


async def connect(url: str) -> nats.NATS:
    """A connection to `url` that reconnects for ever; NatsUnreachable if none answers now.

    nats-py retries a first connection for ever when reconnecting is on (and
    60 times by default), so a connection that tries each server twice asks
    first whether any answers.
    """
    servers = [u.strip() for u in naming.validate_url(url).split(",")]
    try:
        probe = await nats.connect(servers=servers, connect_timeout=CONNECT_TIMEOUT_S,
                                   allow_reconnect=False, max_reconnect_attempts=1,
                                   reconnect_time_wait=0.1, error_cb=_log_error)
    except (nats.errors.NoServersError, OSError, asyncio.TimeoutError,
            nats.errors.TimeoutError) as exc:
        raise NatsUnreachable(url, str(exc) or type(exc).__name__) from None
    await probe.close()
    return await nats.connect(servers=servers, connect_timeout=CONNECT_TIMEOUT_S,
                              allow_reconnect=True, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.25, error_cb=_log_error)


async def _log_error(exc: Exception) -> None:
    log.debug("nats: %s", exc)  # reconnect attempts: the mirror's own warnings say what matters


async def check_jetstream(nc: nats.NATS, url: str) -> None:
    """JetStreamUnavailable unless the server answers JetStream's API for this account.

    A server without JetStream answers at once (503, no responders); a cluster
    electing its metadata leader does not answer until it has one, and is waited for.
    """
    js = nc.jetstream(timeout=CONNECT_TIMEOUT_S)
    try:
        await _through_elections(js.account_info, timeouts_only=True)
    except _JS_ERRORS as exc:
        detail = getattr(exc, "description", None) or type(exc).__name__
        raise JetStreamUnavailable(url, detail) from None


async def ensure_stream(js, name: str, subjects: list[str], replicas: int, kind: str) -> None:
    """Create the stream, or check that the one there is ours with the same subjects.

    Raises StreamMismatch for a stream of that name made otherwise, and
    SubjectsTaken when another stream captures the subjects already.
    """
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        config = StreamConfig(name=name, subjects=subjects, num_replicas=replicas,
                              description=f"agentbus {kind}", metadata={KIND: kind},
                              duplicate_window=120.0)
        try:
            await js.add_stream(config)
        except APIError as exc:
            if exc.err_code == _SUBJECTS_OVERLAP:
                raise SubjectsTaken(name, subjects, exc.description or str(exc)) from None
            raise
        return
    metadata = info.config.metadata or {}
    if sorted(info.config.subjects or []) != sorted(subjects) or metadata.get(KIND) != kind:
        found = f"subjects {info.config.subjects} and metadata {KIND}={metadata.get(KIND)!r}"
        raise StreamMismatch(name, found, f"subjects {subjects} made by agentbus {kind}")


class JetStreamMirror:
    """Publishes `bus`'s log to the stream `stream` at `url`; see the module's doc."""

    def __init__(self, bus: Bus, url: str, stream: str, replicas: int = 1) -> None:
        self.bus, self.url, self.replicas = bus, naming.validate_url(url), replicas
        self.stream = naming.validate_stream_name(stream)
        self.cursor = naming.cursor_name(stream)
        self.progress = MirrorProgress(stream)
        self.stopping = asyncio.Event()
        self.nc: nats.NATS | None = None
        self.js = None
        self._last_id: str | None = None  # the stream's last Nats-Msg-Id (None: empty)

    async def __aenter__(self) -> JetStreamMirror:
        """Connect, check JetStream and the stream, and find where to resume (nothing written)."""
        self.nc = await connect(self.url)
        try:
            await check_jetstream(self.nc, self.url)
            self.js = self.nc.jetstream(timeout=ACK_TIMEOUT_S)
            await _through_elections(lambda: ensure_stream(
                self.js, self.stream, naming.STREAM_SUBJECTS, self.replicas, "mirror"))
            await _through_elections(self._resume)
        except BaseException:
            await self.nc.close()
            raise
        self.progress.resumed_from = self.progress.position
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def run(self, until_caught_up: bool = False) -> MirrorProgress:
        """Mirror until stop() (or, with `until_caught_up`, until the log has no more)."""
        delay = 0.05
        while not self.stopping.is_set():
            try:
                sent = await self.mirror_once()
                delay = 0.05
            except _JS_ERRORS + (nats.errors.ConnectionClosedError,) as exc:
                self.progress.retries += 1
                log.warning("mirror: %s; resuming from the stream's position", exc)
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                await self._resume_when_reachable()
                continue
            if sent == 0:
                if until_caught_up:
                    break
                await asyncio.to_thread(self.bus.wait_for_change, WAIT_S)
        return self.progress

    def stop(self) -> None:
        self.stopping.set()

    async def mirror_once(self) -> int:
        """Publish the next batch above the position and wait for every ack; return how many."""
        batch = await asyncio.to_thread(self.bus.list_messages, self.progress.position, BATCH)
        if not batch:
            return 0
        futures = []
        expected = self._last_id
        for message in batch:
            futures.append(await self.js.publish_async(
                naming.subject_for(message), _body(message),
                headers=_expecting(naming.headers_for(message), expected)))
            expected = message.id
        await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)
        last = batch[-1]
        self.progress.position, self._last_id = last.seq, last.id
        self.progress.published += len(batch)
        await asyncio.to_thread(self.bus.ack, self.cursor, last.seq, include_own=True)
        return len(batch)

    async def _resume(self) -> None:
        """Take the position from the stream's last message, after checking it is this bus's."""
        info = await self.js.stream_info(self.stream)
        if not info.state.messages:
            self.progress.position, self._last_id = 0, None
            return
        last = await self.js.get_msg(self.stream, seq=info.state.last_seq)
        headers = last.headers or {}
        try:
            seq, message_id = int(headers[naming.BUS_SEQ]), headers[naming.MSG_ID]
        except (KeyError, ValueError):
            raise StreamMismatch(self.stream, "a last message without Bus-Seq",
                                 "a mirror of a bus") from None
        self._check_same_bus(seq, message_id)
        self.progress.position, self._last_id = seq, message_id
        if seq > self.bus.cursor(self.cursor):
            self.bus.ack(self.cursor, seq, include_own=True)

    def _check_same_bus(self, seq: int, message_id: str) -> None:
        here = self.bus.list_messages(seq - 1, 1)
        if self.bus.last_seq() < seq:
            raise StreamOfAnotherBus(self.stream, seq, f"and this bus's last seq is"
                                     f" {self.bus.last_seq()}")
        if here and here[0].seq == seq and here[0].id != message_id:
            raise StreamOfAnotherBus(self.stream, seq, f"id {message_id}, and this bus's"
                                     f" message {seq} is {here[0].id}")

    async def _resume_when_reachable(self) -> None:
        try:  # the stream again (made anew if someone deleted it), then its position
            await ensure_stream(self.js, self.stream, naming.STREAM_SUBJECTS, self.replicas,
                                "mirror")
            await self._resume()
        except _JS_ERRORS + (nats.errors.ConnectionClosedError,) as exc:
            log.warning("mirror: the stream does not answer yet: %s", exc)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass


async def _through_elections(step, timeouts_only: bool = False):
    """Run `step()`, again while a cluster answers "no leader yet" (a node was just lost).

    A JetStream cluster that lost the leader of its metadata or of the stream
    times out or answers 503 until the others elect one, in a few seconds.
    """
    deadline = asyncio.get_running_loop().time() + ELECTION_S
    while True:
        try:
            return await step()
        except (nats.errors.TimeoutError, asyncio.TimeoutError, APIError) as exc:
            transient = not isinstance(exc, APIError) or (exc.code == 503 and not timeouts_only)
            if not transient or asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("mirror: JetStream is electing a leader (%s); trying again", exc)
            await asyncio.sleep(0.25)


def _expecting(headers: dict[str, str], previous_id: str | None) -> dict[str, str]:
    """The headers plus the stream's expected last message: `previous_id`, or none at all."""
    if previous_id is None:
        headers[naming.EXPECTED_LAST_SEQUENCE] = "0"
    else:
        headers[naming.EXPECTED_LAST_MSG_ID] = previous_id
    return headers


def _body(message: Message) -> bytes:
    """The message as `bus tail --json` prints it: what a subscriber on NATS reads."""
    return orjson.dumps(message.to_json_dict())
