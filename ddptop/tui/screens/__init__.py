"""The TUI's modal screens, one per file."""
