"""Following rank logs with bounded memory: no newline for megabytes, progress bars (\\r)."""

from ddptop.run.logtail import MAX_LINE, MAX_READ, LogTail


def test_output_without_newlines_is_shown_in_bounded_pieces(tmp_path):
    path = tmp_path / "stdout.log"
    path.write_bytes(b"x" * (3 * MAX_READ) + b"\nafter\n")
    tail, lines = LogTail(), []
    for _ in range(10):
        lines += tail.read(path)
    assert lines[-1] == "after"
    assert all(len(line) <= MAX_LINE + 40 for line in lines)
    assert len(tail._partial.get(path, b"")) <= MAX_LINE


def test_carriage_returns_end_lines_for_display(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_bytes(b"epoch 1:  10%\repoch 1:  50%\repoch 1: 100%\r\ndone\r\n")
    assert LogTail().read(path) == ["epoch 1:  10%", "epoch 1:  50%", "epoch 1: 100%", "done"]
