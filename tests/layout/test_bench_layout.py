"""bench/ by question: what is re-run stays in bench/ with its usage line; each one-off
investigation in bench/investigations/ says its question, its answer and the doc section that
quotes it; every `bench/...` path the repo names exists (a moved file's readers followed it)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
INVESTIGATIONS = BENCH / "investigations"


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_each_rerun_file_has_its_usage_line():
    missing = [p.name for p in sorted(BENCH.glob("*.py")) if f"bench/{p.name}" not in docstring(p)]
    assert not missing, f"no usage line (`... bench/<name>.py ...`) in the docstring of {missing}"


def quoted_sections(text: str) -> list[tuple[str, str]]:
    """(doc, heading) pairs of a docstring's `Quoted in: docs/X.md, "a", "b"; docs/Y.md, "c".`"""
    start = text.find("Quoted in:")
    if start < 0:
        return []
    para = " ".join(text[start:].split("\n\n")[0].split())
    pairs = []
    for part in re.split(r";\s*(?=docs/)", para[len("Quoted in:"):]):
        doc = re.match(r"\s*(docs/[\w./-]+\.md)", part)
        assert doc, f"no docs/*.md in {part!r}"
        pairs += [(doc.group(1), h) for h in re.findall(r'"([^"]+)"', part)]
    return pairs


def test_each_investigation_says_question_answer_and_where_docs_quote_it():
    files = sorted(INVESTIGATIONS.glob("*.py"))
    assert len(files) >= 10, files
    for path in files:
        text = docstring(path)
        assert f"bench/investigations/{path.name}" in text, f"{path.name}: no usage line"
        assert re.search(r"^Question: \S", text, re.M), f"{path.name}: no 'Question:'"
        assert re.search(r"^Answer\b.*: \S", text, re.M), f"{path.name}: no 'Answer:'"
        pairs = quoted_sections(text)
        assert pairs or "not recorded in docs/" in text, f"{path.name}: no 'Quoted in:' section"
        for doc, heading in pairs:
            headings = [line for line in (ROOT / doc).read_text().splitlines() if line.startswith("#")]
            assert any(heading in h for h in headings), f"{path.name}: no heading {heading!r} in {doc}"


def test_the_index_names_every_file_where_it_is():
    index = (BENCH / "README.md").read_text()
    rerun, investigations = index.split("## Investigations", 1)
    investigations = investigations.split("\n## ", 1)[0]
    for path in sorted(BENCH.glob("*.py")) + sorted(BENCH.glob("*.sh")):
        assert f"| `{path.name}` |" in rerun, f"bench/README.md's re-run table lacks {path.name}"
    for path in sorted(INVESTIGATIONS.glob("*.py")):
        assert f"| `{path.name}` |" in investigations, f"bench/README.md's investigations lack {path.name}"


def test_every_bench_path_the_repo_names_exists():
    """Docs, scripts, tests and code name bench files by path; dated raw logs
    (docs/measurements/) keep the paths of their day. A path on a line that says the file was
    retired, or one under ../shared/ (outside the repo), is not this repo's."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n and not n.startswith("docs/measurements/")]
    wrong = []
    for name in names:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".sh", ".toml", ".txt"} or not path.is_file():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in re.finditer(r"(?<![\w/.])bench/[\w/.-]+?\.(?:py|sh)\b", line):
                if not (ROOT / m.group()).exists() and "retired" not in line:
                    wrong.append(f"{name}:{no}: {m.group()}")
    assert not wrong, "paths to no file:\n" + "\n".join(wrong)
