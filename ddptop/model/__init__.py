"""The model of a run: its config, state and every figure a view shows, failures and plain-text reports. Pure: no I/O, no torch, no UI."""
