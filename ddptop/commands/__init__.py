"""What the CLI runs besides the TUI: headless, sweep, tune, attach/ls, trace."""
