"""Every test file runs and every Python file is linted: `make test`'s own pytest and ruff commands, asked what
they see, against the files in the tree.

pytest skips folders named ``build``, ``dist``, ``venv``, ... (its default ``norecursedirs``) and ruff excludes
``dist``, ``venv``, ... and whatever an unanchored ``extend-exclude`` pattern matches anywhere in the tree
(``"data"`` matched ``rag_plugin/data/``): the 75 tests under ``tests/build/`` never ran and ``rag_plugin/data/``
was never linted before these checks. Each check is first shown to catch such a folder in a small tree of its own.
"""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree_files(root: Path, keep) -> set:
    """The files under ``root`` that git tracks or would add (not ignored), or every file where ``root`` is no git
    checkout, as paths relative to ``root``, those for which ``keep(path)`` holds."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True)
    if listed.returncode == 0:
        paths = [Path(line) for line in listed.stdout.splitlines() if (root / line).is_file()]
    else:
        paths = [p.relative_to(root) for p in root.rglob("*") if p.is_file()]
    return {str(p) for p in paths if keep(p)}


def uncollected_test_files(root: Path) -> set:
    """The ``tests/**/test_*.py`` files that ``pytest -q tests`` (run in ``root``) does not collect."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = {line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line}
    return _tree_files(root, lambda p: p.parts[0] == "tests" and p.name.startswith("test_") and p.suffix == ".py") \
        - collected


def unlinted_python_files(root: Path) -> set:
    """The ``.py`` files of the tree that ``ruff check .`` (run in ``root``, with its configuration) does not read."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", "."], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {str(Path(line.strip()).resolve().relative_to(root.resolve()))
            for line in proc.stdout.splitlines() if line.strip().endswith(".py")}
    return _tree_files(root, lambda p: p.suffix == ".py") - seen


def test_every_test_file_is_collected_by_the_test_command():
    assert uncollected_test_files(ROOT) == set(), "rename the folder (pytest skips build/, dist/, venv/, ...)"


def test_every_python_file_is_within_ruffs_reach():
    assert unlinted_python_files(ROOT) == set(), "rename the folder or anchor ruff.toml's exclude pattern with '/'"


def _small_tree(tmp_path: Path) -> Path:
    """A copy of the project's pytest and ruff configuration over a few files, two of them in folders that the
    tools skip by default."""
    for name in ("pytest.ini", "ruff.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for rel in ("tests/__init__.py", "tests/build/__init__.py", "tests/build/test_skipped.py",
                "tests/indexing/__init__.py", "tests/indexing/test_seen.py",
                "pkg/__init__.py", "pkg/dist/__init__.py", "pkg/data/__init__.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def test_one():\n    assert 1 + 1 == 2\n" if rel.endswith(("test_skipped.py", "test_seen.py"))
                        else "")
    return tmp_path


def test_the_checks_catch_folders_the_tools_skip(tmp_path):
    tree = _small_tree(tmp_path)
    assert uncollected_test_files(tree) == {"tests/build/test_skipped.py"}
    assert unlinted_python_files(tree) == {"pkg/dist/__init__.py"}  # pkg/data/ is linted: the pattern is anchored
