"""`python -m trainer` (what ddptop's torchrun command runs on every rank)."""

import sys

from trainer.run import main

sys.exit(main())
