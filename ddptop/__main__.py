"""`python -m ddptop` is the same as the `ddptop` console script."""

import sys

from ddptop.cli import main

if __name__ == "__main__":  # importing this module (a tool walking the package) runs nothing
    sys.exit(main())
