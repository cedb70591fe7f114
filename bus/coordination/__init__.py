"""Coordination: tasks, claims and their fences, reservations of paths (and the
git hook that checks them), heartbeats, names held at run time, tokens, and
the workers table as the bus reads it.

Imports nothing: a module of the room is loaded only by whoever imports it.
"""
