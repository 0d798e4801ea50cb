"""tests/ by room: every test file sits in a room's folder that tests/README.md names in one line,
and no two test files share a name (pytest's default import mode imports them by name)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_sits_in_a_room_that_the_readme_names():
    at_top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not at_top, f"move these into a room's folder (git mv; tests/README.md lists them): {at_top}"
    named = set(re.findall(r"^- `([\w-]+)/`", (TESTS / "README.md").read_text(), re.M))
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= named, f"tests/README.md has no line for {sorted(folders - named)}"
    assert named <= folders, f"tests/README.md names folders that are gone: {sorted(named - folders)}"


def test_test_file_names_are_unique_across_rooms():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__snapshots__" not in p.parts)
    assert not [n for n, c in names.items() if c > 1], names.most_common(3)
