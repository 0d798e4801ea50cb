"""The live Textual front end of ddptop. Reads RunState, posts intents to a
Workbench; never imports torch and never touches sockets or subprocesses."""
