"""docs/architecture.md stays true of the tree (issue 39): every module of a layer is named in
the path table's row for its folder (the row whose path is the longest prefix of the module's
folder), and every file the table names exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
LAYERS = ("paged_kernels", "engine", "analysis", "real_vllm", "app", "bench", "deploy")


def path_table() -> dict[str, str]:
    """The Layers section's table (from its "| path |" header to the first line that is not a
    row): {each path in a row's first cell (a folder ends in "/"): the row's text}."""
    rows, inside = {}, False
    for line in DOC.read_text().splitlines():
        if line.startswith("| path |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        if inside and not line.startswith("|---"):
            for path in re.findall(r"`([^`]+)`", line.split("|")[1]):
                rows[path] = line
    assert rows, "docs/architecture.md has no path table"
    return rows


def row_for(rel: Path, rows: dict[str, str]) -> tuple[str, str] | None:
    folder = rel.parent.as_posix() + "/"
    best = max((p for p in rows if p.endswith("/") and folder.startswith(p)), key=len,
               default=None)
    return (best, rows[best]) if best else None


def named(rel: Path, row: str) -> bool:
    """The row names the file: `x.py`, `x` (a script run by name), or the path from the row's
    folder (`checks/first_run.py`), inside backticks."""
    ticked = set(re.findall(r"`([^`]+)`", row))
    words = {w.strip() for t in ticked for w in re.split(r"[ ,()+]", t)}
    return bool({rel.name, rel.stem} & words) or any(rel.as_posix().endswith(t) for t in ticked)


def test_every_module_is_in_the_path_table():
    rows = path_table()
    missing = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" or "locks" in rel.parts:
                continue
            if rel.as_posix() in rows:                      # a row of its own
                continue
            found = row_for(rel, rows)
            if found is None or not named(rel, found[1]):
                missing.append(f"{rel} (row {found[0] if found else 'none'})")
    assert not missing, ("docs/architecture.md's path table does not name these modules in "
                         "their folder's row:\n  " + "\n  ".join(missing))


def test_the_path_table_names_only_files_that_exist():
    rows = path_table()
    gone = [p for p in rows if not (ROOT / p.rstrip("/")).exists()]
    assert not gone, f"the path table names paths that do not exist: {gone}"
