"""`python -m ddptop` is the same as the `ddptop` console script."""

import sys

from ddptop.cli import main

sys.exit(main())
