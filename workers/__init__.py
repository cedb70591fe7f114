"""The worker lifecycle (state machine, branch-per-worker git, `worker` CLI).

Built in a later issue; the package exists so the layout is fixed from the start.
"""
