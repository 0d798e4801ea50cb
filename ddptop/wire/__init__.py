"""What travels between processes: the rank protocol, the viewer protocol and the run's state as plain data. Pure: no I/O, no torch, no UI."""
