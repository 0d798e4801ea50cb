import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def ddptop_cmd() -> list[str]:
    """The CLI as a user runs it (a subprocess, so exit codes and stdout are real)."""
    return [sys.executable, "-m", "ddptop"]
