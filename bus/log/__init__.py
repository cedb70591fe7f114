"""The log: messages and their payloads, cursors and readers, waking on a commit,
group commit, receipts, search, export, retention and checkpoints.

Imports nothing: a module of the room is loaded only by whoever imports it.
"""
