"""`ddptop topo [--json]`: the NVML topology matrix, like `nvidia-smi topo -m`; without NVML,
one line saying why and exit 0."""

from __future__ import annotations

import argparse
import json

from ddptop.hw.gpu import Nvml
from ddptop.hw.topology import render_topology


def topo_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddptop topo", description="GPU topology from NVML.")
    ap.add_argument("--json", action="store_true", help="print the matrix as JSON")
    return ap


def main_topo(argv: list[str], source: Nvml | None = None) -> int:
    """`ddptop topo [--json]`: the NVML topology matrix; without NVML, one line and exit 0."""
    args = topo_parser().parse_args(argv)
    nvml = source or Nvml()
    try:
        if not nvml.available:
            line = json.dumps({"available": False, "reason": nvml.reason})
            print(line if args.json else nvml.reason)
            return 0
        matrix = nvml.topology()
        print(json.dumps(matrix.to_dict(), indent=2) if args.json else render_topology(matrix))
        return 0
    finally:
        if source is None:
            nvml.close()
