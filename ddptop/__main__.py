"""`python -m ddptop` is the same as the `ddptop` console script."""

import sys


def entry() -> int:
    """The console script: `ddptop.cli.main`, with a Ctrl-C that lands before ddptop's own
    handlers are in place (while it imports, parses, starts) an exit like torchrun's (130),
    not a KeyboardInterrupt traceback."""
    try:
        from ddptop.cli import main

        return main()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # importing this module (a tool walking the package) runs nothing
    sys.exit(entry())
