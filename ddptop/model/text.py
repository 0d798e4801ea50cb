"""Text from outside (a rank's output, a log, a trace, an error file) made safe to show:
every control character as a printable escape, so nothing a rank prints can drive the
terminal (clear it, set its title, write its clipboard through OSC 52). Pure.

Markup is the views' part: they show this text as plain text (Rich `Text`, `markup=False`),
never parse it."""

from __future__ import annotations

import re
from typing import Any

# C0 (but tab), DEL, C1 (0x9b is CSI on 8-bit terminals), lone surrogates (undecodable
# bytes), and the bidirectional overrides that reorder what a line seems to say.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)  # caret notation, as `cat -v`: ESC is ^[
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"<U+{code:04X}>"


def printable(text: str, newlines: bool = False) -> str:
    """`text` with every control character shown as text (`\\x1b[2J` reads `^[[2J`); a
    newline kept only when `newlines`. Idempotent: its output has nothing left to escape."""
    pattern = _UNSAFE_KEEP_NL if newlines else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def printable_tree(value: Any) -> Any:
    """Plain JSON data (a trace's summary: file, stream and kernel names) with every string in
    it, keys too, made `printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value
