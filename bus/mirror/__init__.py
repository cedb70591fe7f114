"""The log mirrored to NATS JetStream, and messages imported from it.

Behind the `[nats]` extra (nats-py). See docs/replication.md.
"""
