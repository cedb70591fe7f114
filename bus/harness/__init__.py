"""The harness of the agents' clients: Claude Code's and Codex's hooks and settings,
the inbox text a hook shows, and keeping the bus out of git.

Imports nothing: a module of the room is loaded only by whoever imports it.
"""
