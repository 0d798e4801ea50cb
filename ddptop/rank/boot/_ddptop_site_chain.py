"""Running the sitecustomize that one of ddptop's shadows: the next one on sys.path after the
folder it stands in. Shared by ddptop's own (rank/boot) and `ddptop cost`'s stamp (rank/stamp,
which loads this file by its path: the plain arm's ranks have no ddptop package on their path).
Named so that no script's own module is shadowed."""

import importlib.machinery
import importlib.util
import os
import sys


def chain(here: str) -> None:
    dirs = [os.path.abspath(p or os.curdir) for p in sys.path]
    # only what stands after `here`: the sitecustomize it shadows (two that chain each other,
    # ddptop's and `ddptop cost`'s stamp, must not find each other again)
    rest = sys.path[dirs.index(here) + 1:] if here in dirs else sys.path
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
