"""The package's shape, checked: the import graph has no circles and no import goes up a layer, functions
fit on a screen, function-local imports say why they are local, and nothing reaches into argparse.

The layers are the architecture in one table, docs/design.md's: a module may import only modules of lower
layers, so data flows one way (cli -> train -> {data, features, model, distributed, evaluate}) and nothing
reaches back up.
"""

import ast
import re
from itertools import takewhile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_squad"
DESIGN = ROOT / "docs" / "design.md"
LAYERS_MARKER = "<!-- layers: read by tests/test_structure.py, lowest first -->"
MAX_FUNCTION_LINES = 50


def modules():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if not name.endswith("__init__"):
            found[name] = ast.parse(path.read_text(), str(path))
    return found


def type_only(tree):
    """The nodes under `if TYPE_CHECKING:`: imports a type checker reads and the program never runs."""
    guards = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")]
    return {id(inner) for guard in guards for statement in guard.body for inner in ast.walk(statement)}


def project_imports(tree, names):
    """Modules of the package that `tree` imports, anywhere in it but under `if TYPE_CHECKING:`."""
    out, skipped = set(), type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_squad"):
            base = node.module.removeprefix("bert_squad").lstrip(".")
            out |= {n for n in [base, *(f"{base}.{a.name}".lstrip(".") for a in node.names)] if n in names}
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("bert_squad.") for a in node.names if a.name.startswith("bert_squad.")}
    return out


def functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def layers():
    """docs/design.md's layer table, lowest first: the modules (in backticks) of each row's second column."""
    text = DESIGN.read_text()
    assert LAYERS_MARKER in text, f"{DESIGN}: no layer table after {LAYERS_MARKER}"
    rows = list(takewhile(lambda line: line.startswith("|"), text.split(LAYERS_MARKER, 1)[1].strip().splitlines()))
    found = [set(re.findall(r"`([\w.]+)`", row.split("|")[2])) for row in rows[2:]]  # past the header and |---|
    assert found and all(found), f"{DESIGN}: a layer table with an empty row, or none: {rows}"
    return found


def upward_imports(found, layers):
    """(importer, imported) for each import of a module at or above the importer's own layer."""
    layer = {name: i for i, names in enumerate(layers) for name in names}
    return [
        (m, t) for m, tree in found.items() for t in project_imports(tree, found) if t != m and layer[t] >= layer[m]
    ]


def test_every_module_has_a_layer():
    layered = set().union(*layers())
    assert set(modules()) == layered, (
        f"add to docs/design.md's layers: {set(modules()) - layered}, gone: {layered - set(modules())}"
    )


def test_imports_only_go_down_a_layer():
    upward = upward_imports(modules(), layers())
    assert not upward, f"imports at or above the importer's layer: {upward}"


def test_a_type_only_import_is_no_dependency():
    """An annotation may name a type of any layer (the value arrives as an argument, down the calls); the same
    import outside `if TYPE_CHECKING:` is an import up a layer."""
    found = modules()
    guarded = "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bert_squad.cli import main\n"
    found["errors"] = ast.parse((PACKAGE / "errors.py").read_text() + guarded)
    assert ("errors", "cli") not in upward_imports(found, layers())
    found["errors"] = ast.parse((PACKAGE / "errors.py").read_text() + guarded.replace("if TYPE_CHECKING", "if True"))
    assert ("errors", "cli") in upward_imports(found, layers())


def test_the_checker_sees_an_import_up_a_layer():
    """With design.md's layers, a foundation that imports the entry point is caught, and so is an import
    within one layer."""
    found = modules()
    found["errors"] = ast.parse((PACKAGE / "errors.py").read_text() + "\nfrom bert_squad import cli\n")
    found["perf"] = ast.parse((PACKAGE / "perf.py").read_text() + "\nfrom bert_squad.errors import UserError\n")
    assert sorted(upward_imports(found, layers())) == [("errors", "cli"), ("perf", "errors")]


def test_no_function_is_longer_than_a_screen():
    long = [
        (path, f.name, f.end_lineno - f.lineno + 1)
        for path, tree in modules().items()
        for f in functions(tree)
        if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_a_local_import_says_why_it_is_local():
    """A function-local import keeps a heavy library out of commands that do not need it, and says so."""
    silent = []
    for name, tree in modules().items():
        lines = (PACKAGE / (name.replace(".", "/") + ".py")).read_text().splitlines()
        for f in functions(tree):
            local = sorted(n.lineno for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)))
            if local and "#" not in lines[local[0] - 1]:
                silent.append(f"{name}.{f.name}: {lines[local[0] - 1].strip()}")
    assert not silent, silent


@pytest.mark.parametrize("private", ["._actions", ".error =", "parse_known_args ="])
def test_nothing_reaches_into_argparse(private):
    users = [p.name for p in PACKAGE.rglob("*.py") if private in p.read_text()]
    assert not users, f"{private} in {users}"


def deepspeed_names(tree):
    """The names a module binds to DeepSpeed: `deepspeed` (and its aliases) and what it imports from deepspeed.*."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "deepspeed"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deepspeed":
            names |= {a.asname or a.name for a in node.names}
    return names


def root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def test_nothing_private_of_deepspeed_is_used():
    """The package leans on DeepSpeed's public surface only: no attribute starting with `_` of a DeepSpeed module,
    class or engine (a variable named for one), and no class's `__dict__`, so that a release that renames an
    internal cannot break a run. The one internal a workaround touches is read by name where present
    (runtime.SHM_OPS_TABLE)."""
    found = []
    for name, tree in modules().items():
        ours = deepspeed_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            root = root_name(node.value)
            if node.attr == "__dict__" or root in ours or (root and "engine" in root.lower()):
                found.append(f"bert_squad/{name.replace('.', '/')}.py:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
