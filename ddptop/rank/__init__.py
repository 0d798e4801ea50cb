"""What runs inside the ranks: ddptop's instrumentation layer.

`boot/sitecustomize.py` (on the ranks' PYTHONPATH) calls `attach.watch()`, which waits for
the script to import torch and then measures it through torch's own hooks
(`instrument.Instrument`). Modules here import torch only once the script has, and never
import the monitor's UI or asyncio code.
"""
