"""`join`: the agent name of a server started without --agent, chosen by the agent itself."""

from __future__ import annotations

import threading
from typing import Annotated
from typing import Any
from typing import Optional

from pydantic import Field

from bus.api import Bus
from bus.storage.errors import BusError
from bus.coordination.held_names import HOLD_MS
from bus.coordination.held_names import join_name
from bus.coordination.held_names import renew_name
from bus.mcpserver.kinds import SETS
from bus.mcpserver.session import AgentSession


class AlreadyJoined(BusError):
    error_code = "already_joined"

    def __init__(self, agent: str) -> None:
        super().__init__(f"name: this session is agent {agent!r} already; one session is one"
                         " agent (start another server for another name)")
        self.field = "name"


class IdentityTools:
    """The one tool a session without a name may call."""

    JOIN = "join"

    def __init__(self, session: AgentSession) -> None:
        self.session = session

    def join(
        self,
        name: Annotated[str, Field(min_length=1, description=(
            "Your agent name: letters, digits and . _ : - (e.g. planner, worker-2)."))],
        reclaim_token: Annotated[Optional[str], Field(min_length=1, description=(
            "An earlier join's token for this name."))] = None,
    ) -> dict[str, Any]:
        """Choose your agent name first: every other tool is refused until then.

        A live agent's name is refused. Keep the reclaim_token to take it back later.
        """
        if self.session.agent is not None:
            raise AlreadyJoined(self.session.agent)
        with self.session.bus.write() as conn:
            token = join_name(conn, name, reclaim_token)
        self.session.agent = name
        _Holder(self.session.bus.path, name, token).start()
        return {"agent": name, "reclaim_token": token}

    TOOLS = {JOIN: SETS}


class _Holder(threading.Thread):
    """Renews the name's hold while the server runs, on a connection of its own (one per thread).

    A daemon: the hold ends HOLD_MS after the process does, however it ends.
    """

    def __init__(self, path: str, name: str, token: str) -> None:
        super().__init__(name=f"hold {name}", daemon=True)
        self.path, self.name_held, self.token = path, name, token

    def run(self) -> None:
        stop = threading.Event()
        with Bus.open(self.path) as bus:
            while not stop.wait(HOLD_MS / 4000):
                try:
                    with bus.write() as conn:
                        if not renew_name(conn, self.name_held, self.token):
                            return
                except BusError:  # busy or read-only for a moment: the next turn retries
                    continue
