"""SVG pictures of every tab from the scripted run the snapshot tests draw
(ddptop.tui.synthetic.snapshot_app: the clock stopped, every view filled), at each size and
rank count:

    .venv/bin/python scripts/snapshots.py      # -> screenshots/snap-<tab>-<W>x<H>-<N>r.svg
    .venv/bin/python scripts/snapshots.py --tabs ranks runs --sizes 80x24 --ranks 8

The same bytes on every run (Textual is pinned in the dev extra), so a layout change shows up
as a diff of these files. The ranks tab is named `overview`, as in the real-run pictures
(*-cpu.svg, *-gpu.svg), which scripts/screenshots.py takes from a live run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import zlib
from pathlib import Path

from ddptop.tui.synthetic import show_tab, snapshot_app
from ddptop.tui.views import TABS

REPO = Path(__file__).resolve().parent.parent
SIZES = ("80x24", "120x40", "200x60")
RANKS = (2, 8, 64)
NAMES = {"ranks": "overview"}


async def shoot(tab: str, size: str, ranks: int, out: Path) -> Path:
    width, height = (int(x) for x in size.split("x"))
    name = f"snap-{NAMES.get(tab, tab)}-{size}-{ranks}r"
    with tempfile.TemporaryDirectory(prefix="ddptop-snap-") as runs_dir:
        app = snapshot_app(ranks, Path(runs_dir))
        async with app.run_test(size=(width, height)) as pilot:
            await show_tab(app, pilot, tab)
            svg = app.export_screenshot(simplify=True)
    # Rich gives each export a random id; one from the name keeps the file the same bytes.
    svg = re.sub(r"\bterminal-\d+-", f"terminal-{zlib.crc32(name.encode())}-", svg)
    path = out / f"{name}.svg"
    path.write_text(svg)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "screenshots"))
    p.add_argument("--tabs", nargs="+", choices=TABS, default=list(TABS))
    p.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    p.add_argument("--ranks", nargs="+", type=int, default=list(RANKS))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for ranks in args.ranks:
        for size in args.sizes:
            for tab in args.tabs:
                print(f"  {asyncio.run(shoot(tab, size, ranks, out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
