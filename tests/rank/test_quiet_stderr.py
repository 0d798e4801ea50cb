"""call_without: torch's C++ line about ddptop's own call is held back from the script's stderr,
and nothing else is (issue 42, Must show 4). The call writes to fd 2 as C++ does (below Python)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ddptop.rank.quiet_stderr import drop_lines

CHILD = textwrap.dedent('''
    import ctypes, os, sys
    from ddptop.rank.quiet_stderr import call_without
    libc = ctypes.CDLL(None)
    def register():  # as torch's TORCH_WARN_ONCE does: straight to fd 2, from C
        for line in (b"before\\n", b"[W1127] Warning: ProcessGroupNCCL OnCompletion hook will be deprecated\\n", b"after\\n"):
            libc.write(2, line, len(line))
        return 7
    print("user line 1", file=sys.stderr)
    assert call_without(register, "OnCompletion hook will be deprecated") == 7
    print("user line 2", file=sys.stderr)
    def fails():
        libc.write(2, b"kept on error\\n", 14)
        raise ValueError("x")
    try:
        call_without(fails, "nothing")
    except ValueError:
        print("raised through", file=sys.stderr)
''')


def test_only_the_named_line_is_dropped_and_order_is_kept() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert out.stderr.splitlines() == ["user line 1", "before", "after", "user line 2", "kept on error", "raised through"]


def test_drop_lines() -> None:
    assert drop_lines(b"a\nwarn x\nb", b"warn") == b"a\nb"
    assert drop_lines(b"", b"w") == b""
