"""The TUI's widgets, one per file, named after the class."""
