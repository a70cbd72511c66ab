"""The project's modules import each other without cycles, nothing imports benchmarks/, and generate.py's imports
stay free of Lightning.

The graph is read from the source with `ast` (every import counts, also one inside a function, since it runs
when called; only `if TYPE_CHECKING:` blocks are skipped: they never run). A module importing `a.b.c`
depends on `a.b.c` alone, not on the packages above it, which Python has already started importing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "common",
    "model",
    "cpu_kernels",
    "data",
    "training",
    "inspection",
    "interop",
    "checkpoints",
    "generation",
    "benchmarks",
)
SCRIPTS = ("generate.py", "train.py")


def module_files(root: Path) -> dict[str, Path]:
    """{dotted module name: file} for the project's packages and top-level scripts under `root`."""
    found = {path.stem: root / path for path in map(Path, SCRIPTS) if (root / path).is_file()}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (imports for annotations only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module `name` (file `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from a import b` imports the module a.b when there is one, else the name b from a.
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {target for target in targets if target in modules and target != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_graph_sees_the_project():
    graph = import_graph(ROOT)
    assert "checkpoints.format" in graph["generate"] | graph["interop.load"]
    assert "model.gpt" in graph["model"] and "training.cli" in graph["train"]


def test_no_import_cycles():
    assert import_cycles(import_graph(ROOT)) == []


def test_no_package_or_command_imports_benchmarks():
    # benchmarks/ is scripts that measure the product; the product must not need them to run.
    importers = {
        name: sorted(target for target in targets if target.split(".")[0] == "benchmarks")
        for name, targets in import_graph(ROOT).items()
        if name.split(".")[0] != "benchmarks"
    }
    assert {name: found for name, found in importers.items() if found} == {}


def test_only_the_benchmark_tests_import_benchmarks():
    # Shapes and helpers the tests share live in tests/ (tests/shapes.py) or the product, so a benchmark can be
    # retired without breaking a test of something else.
    tests = ROOT / "tests"
    importers = {
        str(path.relative_to(ROOT)): sorted(
            name for name in outside_imports(path) if name.split(".")[0] == "benchmarks"
        )
        for path in sorted(tests.rglob("*.py"))
        if path.relative_to(tests).parts[0] != "benchmarks"
    }
    assert {path: found for path, found in importers.items() if found} == {}


def test_a_cycle_is_found(tmp_path):
    # A scratch copy where model/config.py imports model/gpt.py, which imports model/config.py.
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    config = tmp_path / "model" / "config.py"
    config.write_text(config.read_text(encoding="utf-8") + "\n\ndef late():\n    from .gpt import GPT\n")
    assert ["model.config", "model.gpt"] in [
        [m for m in cycle if m in ("model.config", "model.gpt")]
        for cycle in import_cycles(import_graph(tmp_path))
    ]


def outside_imports(path: Path) -> set[str]:
    """The absolute modules a file imports (`a.b` for `import a.b`, `from a.b import c`); relative ones left out."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_model_is_pure_torch():
    # The network a learner reads: Python files that import torch, the standard library and common/ alone, and
    # build nothing (no C++ source, no extension loader, no custom op).
    folder = ROOT / "model"
    files = [path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert {path.suffix for path in files} == {".py"}, sorted(map(str, files))
    allowed = sys.stdlib_module_names | {"torch", "common"}
    imports = {name for path in files for name in outside_imports(path)}
    assert {name for name in imports if name.split(".")[0] not in allowed} == set()
    assert not {name for name in imports if name.startswith("torch.utils.cpp_extension")}
    assert not [path.name for path in files if "torch.ops." in path.read_text(encoding="utf-8")]


def test_generate_imports_no_lightning_wandb_or_training():
    probe = (
        "import sys, generate; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'wandb', 'training'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
