"""The monitor must never import torch (fast start on login nodes), and pure
modules must not import the UI."""

import subprocess
import sys

import pytest

NO_TORCH = ["ddptop.cli", "ddptop.session", "ddptop.headless", "ddptop.probe", "ddptop.hub",
            "ddptop.state", "ddptop.config", "ddptop.protocol", "ddptop.launcher", "ddptop.report",
            "ddptop.sweep", "ddptop.advisor", "ddptop.capture", "ddptop.nccl", "ddptop.gpu",
            "ddptop.live", "ddptop.supervisor", "ddptop.viewer", "ddptop.viewer_protocol", "ddptop.attach",
            "ddptop.workbench", "ddptop.nsys"]
PURE = ["ddptop.config", "ddptop.protocol", "ddptop.state", "ddptop.failures", "ddptop.advisor", "ddptop.nccl",
        "ddptop.viewer_protocol", "ddptop.state_codec", "ddptop.nsys_stats"]


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", NO_TORCH)
def test_monitor_modules_do_not_import_torch(module):
    mods = loaded_after_import(module)
    assert "torch" not in mods
    assert "textual" not in mods  # the UI is imported only when the TUI starts


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_do_no_io_imports(module):
    mods = loaded_after_import(module)
    assert not {"asyncio", "socket", "subprocess", "textual", "pynvml"} & mods, module
