"""What the server tells a client about itself at the handshake, apart from the SDK.

Kept out of server.py, which imports the SDK, so that the stdio start (stdio.py)
can fill in the agent's name in a handshake answered from its cache.
"""

from __future__ import annotations

AS_AGENT = (
    "agentbus: a message bus shared by agents, in one SQLite file. You act as agent {agent};"
    " every tool publishes, acks, claims and reserves as {agent} and as no one else. Poll for"
    " messages and ack what you handled (or poll with ack_through); ask and get the answer in"
    " one call with exchange, and answer a question with reply; take work with"
    " task_claim_next and finish it with task_done; reserve files before editing them."
    " Errors carry a code and name the argument at fault and how to fix it."
)
TO_JOIN = (
    "agentbus: a message bus shared by agents, in one SQLite file. Call join(name) first to"
    " choose your agent name (keep the reclaim_token it returns: after a restart,"
    " join(name, reclaim_token) takes the name back); every other tool is refused until then."
    " Errors carry a code and name the argument at fault and how to fix it."
)


def instructions(agent: str | None) -> str:
    """The instructions for a server acting as `agent`, or, for None, one waiting for join."""
    return TO_JOIN if agent is None else AS_AGENT.format(agent=agent)
