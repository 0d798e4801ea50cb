"""What runs inside the ranks: ddptop's instrumentation layer.

`boot/sitecustomize.py` (on the ranks' PYTHONPATH) calls `attach.watch()`, which waits for
the script to import torch and then measures it through torch's own hooks
(`instrument.Instrument`, which wires together `patches`, `forward_hooks`, `steps`,
`ddp_comm`/`comm`, `ddp_settings`, `facts`, `values` and `capture`; `client.Probe` is the
connection to the hub, public as `ddptop.probe`). Modules here import torch only once the
script has, and never import the monitor's UI or asyncio code.
"""
