"""The message pump (seed 000): organism.yaml, the out-of-band control channel.

`bus.pump.organism` loads and checks organism.yaml; `bus.pump.oob` signs,
verifies and serves privileged control requests. The thread registry the
pump records conversations in is `bus.threads`.
"""
