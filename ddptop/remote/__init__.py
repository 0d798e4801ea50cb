"""Runs that outlive their terminal: the supervisor process, viewers that attach to it, the live-run registry and the web view."""
