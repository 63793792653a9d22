"""The import graph of ``rag_plugin/``: its layers, low to high, and no import circle between its packages.

Every ``rag_plugin/**/*.py`` is read with ``ast``: its top-level imports AND its function-local ones (and
``importlib.import_module("rag_plugin...")`` with a literal name), absolute and relative. Each module belongs to
a node: the longest entry of :data:`LAYERS` that it is, or is inside of (``optim.lr_scale``), else its
sub-package (``hub`` is the node of ``hub.py``). Two rules:

1. a module imports only from its own layer or a lower one: so the model, the criterion and the generators
   (one layer) never import the task's module (``rag_plugin.tasks``, two layers up), and nothing imports the
   command lines;
2. no import circle between nodes, within a layer included (``models``, ``criterions`` and ``generation`` may
   import one another, one way); and none between the modules of one node.

Importing the package root, ``import rag_plugin`` (to call ``rag_plugin.register()``), is allowed anywhere: it is
the registration entry point, and the root's own imports (the modules it registers) are not edges of the graph.
A package that imports or is imported and is in no layer is reported too. Imports within one node are free of
the layer order. Function-local imports count as much as top-level ones: they are kept for optional
dependencies and start-up cost only (docs/architecture.md).
"""
import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]

#: the layers of rag_plugin, low to high, one a line; a module may import from its own layer or a lower one
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("util",),
    ("core",),
    ("optim.lr_scale",),
    ("retrieval",),
    ("indexing",),
    ("data",),
    ("reranking",),
    ("models", "criterions", "generation", "optim.torch_adamw"),
    ("reindexing",),
    ("tasks",),
    ("hub", "conversion", "evaluation"),
    ("datasets", "pipeline", "fairseq_hooks"),
    ("serving",),
    ("cli",),
)


class Import(NamedTuple):
    path: str      # the importing file, relative to the package's parent
    line: int
    source: str    # the importing module's node
    target: str    # the imported module's node
    module: str    # the imported module, dotted
    importer: str  # the importing module, dotted


def _module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> List[Tuple[int, str, Sequence[str]]]:
    """(line, imported module, names taken from it) of every import in ``tree``, relative ones resolved."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                anchor = here[:len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == \
                "import_module" and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value, ()))
    return found


def node_of(module: str, package: str, layers: Sequence[Sequence[str]] = LAYERS) -> Optional[str]:
    """The node of ``module`` (dotted, from the package's name): the longest entry of ``layers`` that it is or is
    inside of, else its sub-package or top-level module; None for the package root."""
    rest = module.split(".")[1:]
    if not rest:
        return None
    names = sorted((n for layer in layers for n in layer), key=lambda n: -len(n.split(".")))
    for name in names:
        if rest[:len(name.split("."))] == name.split("."):
            return name
    return rest[0]


def read_imports(package_dir: Path, layers: Sequence[Sequence[str]] = LAYERS) -> List[Import]:
    """Every import of a module of the package in ``package_dir`` from another of its modules (the root's
    imports, and imports of the root, left out)."""
    package = package_dir.name
    files = sorted(package_dir.rglob("*.py"))
    modules = {_module_name(f, package_dir) for f in files}
    modules |= {_module_name(d / "__init__.py", package_dir) for d in package_dir.rglob("*") if d.is_dir()}
    edges = []
    for path in files:
        module = _module_name(path, package_dir)
        source = node_of(module, package, layers)
        if source is None:  # the package root: the registration entry point
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, base, names in _imported_names(tree, module, path.name == "__init__.py"):
            if base != package and not base.startswith(package + "."):
                continue
            targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules] or [base]
            for target in targets:
                node = node_of(target, package, layers)
                if node is not None and target != module:
                    edges.append(Import(path.relative_to(package_dir.parent).as_posix(), line, source, node, target,
                                        module))
    return edges


def _cycles(arrows: List[Tuple[str, str]]) -> List[List[str]]:
    """The strongly connected components of two or more vertices of the graph ``arrows`` (Tarjan's algorithm)."""
    graph: Dict[str, set] = defaultdict(set)
    for a, b in arrows:
        graph[a].add(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: set = set()
    components: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return components


def _circle_lines(edges: List[Import], vertex) -> List[str]:
    """One line per circle of the graph whose vertices ``vertex(edge)`` gives (source, target): its arrows, the
    first import of each with file:line."""
    out = []
    for component in _cycles([vertex(e) for e in edges]):
        members = set(component)
        firsts: Dict[Tuple[str, str], Import] = {}
        for e in edges:
            if set(vertex(e)) <= members:
                firsts.setdefault(vertex(e), e)
        arrows = "; ".join(f"{e.path}:{e.line} ({a} -> {b}{'' if b == e.module else ': ' + e.module})"
                           for (a, b), e in sorted(firsts.items()))
        out.append(f"import circle between {', '.join(component)}: {arrows}")
    return out


def import_violations(package_dir: Path, layers: Sequence[Sequence[str]] = LAYERS) -> List[str]:
    """One line per violation, with file:line: an import from a higher layer, a node in no layer, a circle between
    nodes, a circle between modules."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    every = read_imports(package_dir, layers)
    edges = [e for e in every if e.source != e.target]
    out = []
    unplaced = sorted({n for e in edges for n in (e.source, e.target) if n not in rank})
    for node in unplaced:
        first = next(e for e in edges if node in (e.source, e.target))
        out.append(f"{first.path}:{first.line}: {package_dir.name}.{node} is in no layer (add it to LAYERS)")
    for e in edges:
        if e.source in rank and e.target in rank and rank[e.target] > rank[e.source]:
            out.append(f"{e.path}:{e.line}: {e.source} (layer {rank[e.source]}) imports {e.module} "
                       f"({e.target}, layer {rank[e.target]}: higher)")
    out += _circle_lines(edges, lambda e: (e.source, e.target))
    within = [e for e in every if e.source == e.target]  # a circle across nodes is one of theirs already
    return out + _circle_lines(within, lambda e: (e.importer, e.module))


# ------------------------------------------------------------------------------------------------ the tree
def test_rag_plugin_keeps_its_layers_and_has_no_import_circle():
    violations = import_violations(ROOT / "rag_plugin")
    assert not violations, "\n" + "\n".join(violations)


def test_every_package_of_rag_plugin_is_in_a_layer_or_unused():
    """LAYERS names packages that exist (a renamed package must be renamed here too)."""
    package_dir = ROOT / "rag_plugin"
    for name in (n for layer in LAYERS for n in layer):
        path = package_dir.joinpath(*name.split("."))
        assert path.is_dir() or path.with_suffix(".py").is_file(), name


# ----------------------------------------------------------------------------------- the checker itself
def _tree(root: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


SMALL_LAYERS = (("util",), ("core", "other"), ("models", "generation"), ("tasks",), ("cli",))


def test_the_checker_reports_an_upward_import_and_a_circle_with_file_and_line(tmp_path):
    package = _tree(tmp_path, {
        "__init__.py": "import pkg.cli.main\n",  # the root imports anything: not an edge
        "util/__init__.py": "",
        "util/io.py": "import os\n\n\ndef read():\n    from pkg.core import math  # upward, function-local\n",
        "core/__init__.py": "",
        "core/math.py": "from ..util import io\nimport pkg\n",  # relative, downward; the root: allowed
        "models/__init__.py": "",
        "models/rag.py": "from pkg.generation.beam import search\n",
        "generation/__init__.py": "",
        "generation/beam.py": "def search():\n    from pkg.models import rag\n    from pkg.tasks import task\n",
        "tasks/task.py": "from pkg import cli\n",
        "cli/__init__.py": "",
        "cli/main.py": "import importlib\nimportlib.import_module('pkg.stray.thing')\n",
        "stray/thing.py": "",
        "util/a.py": "from pkg.util import b\n",
        "util/b.py": "def f():\n    from . import a\n",  # a circle of modules within one node
    })
    violations = import_violations(package, SMALL_LAYERS)
    assert violations == [
        "pkg/cli/main.py:2: pkg.stray is in no layer (add it to LAYERS)",
        "pkg/generation/beam.py:3: generation (layer 2) imports pkg.tasks.task (tasks, layer 3: higher)",
        "pkg/tasks/task.py:1: tasks (layer 3) imports pkg.cli (cli, layer 4: higher)",
        "pkg/util/io.py:5: util (layer 0) imports pkg.core.math (core, layer 1: higher)",
        "import circle between core, util: pkg/core/math.py:1 (core -> util: pkg.util.io); "  # relative, resolved
        "pkg/util/io.py:5 (util -> core: pkg.core.math)",
        "import circle between generation, models: pkg/generation/beam.py:2 (generation -> models: pkg.models.rag); "
        "pkg/models/rag.py:1 (models -> generation: pkg.generation.beam)",
        "import circle between pkg.util.a, pkg.util.b: pkg/util/a.py:1 (pkg.util.a -> pkg.util.b); "
        "pkg/util/b.py:2 (pkg.util.b -> pkg.util.a)",
    ], violations


def test_the_checker_passes_a_layered_tree_and_finds_a_circle_across_layers(tmp_path):
    layered = _tree(tmp_path / "a", {"util/io.py": "", "core/math.py": "from pkg.util import io\n",
                                     "tasks/task.py": "import pkg.core.math\nimport pkg\nfrom pkg import register\n"})
    assert import_violations(layered, SMALL_LAYERS) == []
    circle = _tree(tmp_path / "b", {"util/io.py": "from pkg.core import math\n",
                                    "core/math.py": "import pkg.util.io\n"})
    violations = import_violations(circle, SMALL_LAYERS)
    assert violations[-1] == ("import circle between core, util: pkg/core/math.py:1 (core -> util: pkg.util.io); "
                              "pkg/util/io.py:1 (util -> core: pkg.core.math)"), violations
    assert len(violations) == 2  # and the upward arrow of the two
