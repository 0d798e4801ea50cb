"""`ddptop nccl LOGFILE... [--json]`: reads NCCL_DEBUG=INFO logs (plain or gzipped, bounded)
and prints the transport matrix and facts ddptop.analysis.nccl finds in them. Usage mistakes
raise UsageError (one line, exit 2 from the main command)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import zlib
from collections.abc import Iterator

from ddptop.analysis.nccl import MAX_LINE_CHARS, SHOWN, NcclParser, render_report
from ddptop.model.usage import OneLineParser, UsageError

MAX_FILE_BYTES = 256 << 20  # read per log file (--max-mb)


class LogFile:
    """Lines of one log file, plain or gzipped (by its magic bytes, whatever its name), read in
    chunks up to `max_bytes` (then `truncated`); a line longer than MAX_LINE_CHARS is cut and
    the rest of it skipped; bytes that are not UTF-8 become U+FFFD (counted as garbled)."""

    def __init__(self, path: str, max_bytes: int = MAX_FILE_BYTES) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.read_bytes = 0
        self.truncated = False
        self.compressed = False

    def lines(self) -> Iterator[str]:
        pending, skipping = b"", False
        for chunk in self._chunks():
            if skipping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    continue
                chunk, skipping = chunk[cut + 1:], False
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            for part in parts:
                yield part[:MAX_LINE_CHARS].decode("utf-8", "replace")
            if len(pending) > MAX_LINE_CHARS:
                yield pending[:MAX_LINE_CHARS].decode("utf-8", "replace")
                pending, skipping = b"", True
        if pending:
            yield pending.decode("utf-8", "replace")

    def _chunks(self) -> Iterator[bytes]:
        """The file's bytes (decompressed when gzipped), at most max_bytes of them; a .gz cut
        short raises EOFError after what could be read."""
        with open(self.path, "rb") as f:
            self.compressed = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            unzip = zlib.decompressobj(wbits=31) if self.compressed else None
            data = b""
            while self.read_bytes < self.max_bytes:
                if not data:
                    data = f.read(1 << 20 if unzip is None else 1 << 16)
                    if not data:
                        if unzip is not None and not unzip.eof:
                            raise EOFError("compressed log ends early")
                        return
                if unzip is None:
                    out, data = data, b""
                else:
                    if unzip.eof:  # another gzip member follows
                        data, unzip = unzip.unused_data + data, zlib.decompressobj(wbits=31)
                    out = unzip.decompress(data, 1 << 20)  # bounded: a small .gz may inflate to GBs
                    data = unzip.unconsumed_tail
                room = self.max_bytes - self.read_bytes
                if len(out) > room:
                    out, self.truncated = out[:room], True
                self.read_bytes += len(out)
                if out:
                    yield out
            if not self.truncated:
                self.truncated = bool(data) or bool(f.read(1)) or (unzip is not None and not unzip.eof)


def read_log_lines(path: str, max_bytes: int = MAX_FILE_BYTES) -> Iterator[str]:
    """Lines of one log file (plain or gzipped), at most `max_bytes` of it."""
    return LogFile(path, max_bytes).lines()


def nccl_parser() -> OneLineParser:
    p = OneLineParser(
        prog="ddptop nccl",
        description="Show the NCCL transport matrix and facts from NCCL_DEBUG=INFO logs (plain or .gz).",
    )
    p.add_argument("logs", nargs="+", metavar="LOGFILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--max-mb", type=float, default=MAX_FILE_BYTES >> 20,
                   help=f"read at most this many MB of each file (default {MAX_FILE_BYTES >> 20})")
    return p


def main_nccl(argv: list[str]) -> int:
    """`ddptop nccl LOGFILE... [--json]`: transport matrix and facts from NCCL_DEBUG logs.
    Usage mistakes raise UsageError (one line, exit 2 from the main command)."""
    args = nccl_parser().parse_args(argv)
    if not (args.max_mb == args.max_mb and 0 < args.max_mb <= 1 << 20):
        raise UsageError(f"--max-mb must be above 0 and at most {1 << 20}, got {args.max_mb:g}")
    parser = NcclParser()
    readable, notes = 0, []
    for path in args.logs:
        log = LogFile(path, int(args.max_mb * (1 << 20)))
        try:
            parser.feed_lines(log.lines())
            readable += 1
        except OSError as err:  # missing, unreadable, a directory, a broken .gz
            if log.read_bytes:
                readable += 1
                notes.append(f"{_show(path)}: stopped after {log.read_bytes >> 20} MB: {_os_error(err)}")
            else:
                print(f"ddptop nccl: skipping {_show(path)}: {_os_error(err)}", file=sys.stderr)
            continue
        except (EOFError, zlib.error) as err:  # a .gz cut short
            readable += 1
            notes.append(f"{_show(path)}: compressed log ends early ({type(err).__name__})")
            continue
        if log.truncated:
            notes.append(f"{_show(path)}: read the first {log.read_bytes / (1 << 20):.0f} MB only (--max-mb)")
    if readable == 0:
        print("ddptop nccl: none of the log files could be read", file=sys.stderr)
        return 2
    for note in notes[:SHOWN]:
        print(f"ddptop nccl: {note}", file=sys.stderr)
    report = parser.report()
    if args.json:
        data = report.to_dict()
        data["files_read"] = readable
        data["files_skipped"] = len(args.logs) - readable
        data["notes"] = notes
        _emit(json.dumps(data, indent=2))
    elif report.nccl_lines == 0:
        _emit("ddptop nccl: no NCCL_DEBUG lines found (was NCCL_DEBUG=INFO set?)")
    else:
        _emit(render_report(report))
    return 0 if report.nccl_lines else 1


def _emit(text: str) -> None:
    """Print; a reader that went away (`| head`) ends the output, not the command with a traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def _show(path: str) -> str:
    return ascii(path)[1:-1] if not path.isprintable() else path


def _os_error(err: OSError) -> str:
    return str(err.strerror or err)[:200]
