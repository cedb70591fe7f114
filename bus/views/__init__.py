"""Views for people: the one status snapshot, and the terminal and web views over it.

`status.read_status` is the only place that computes "what is the state of the
bus"; `bus status`, `bus top` and `bus serve` render it. The views read the
file through read-only connections, so watching never changes what it watches.
"""
