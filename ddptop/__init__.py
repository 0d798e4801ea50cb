"""ddptop: top for PyTorch DistributedDataParallel.

This package is the monitor; it must never import torch (the ranks do, in
`trainer/` and lazily in `ddptop.probe`).
"""

__version__ = "0.1.0"
