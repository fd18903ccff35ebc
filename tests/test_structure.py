"""The package's shape, checked: the import graph has no circles and no import goes up a layer, functions
fit on a screen, function-local imports say why they are local, and nothing reaches into argparse.

The layers are the architecture in one list: a module may import only modules of lower layers, so data
flows one way (cli -> train -> {data, features, model, distributed, evaluate}) and nothing reaches back up.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bert_squad"
LAYERS = [
    # foundations: no project imports
    {"errors", "outputs", "squad", "postprocess", "batching", "perf", "preemption", "transport", "commands",
     "span_head"},
    {"files", "metrics", "distributed", "runtime", "model"},  # files, scores, ranks, loading
    {"cache"},  # the cache layout
    {"config", "features", "checkpoint", "best"},  # typed options; things the run is made of
    {"data", "dsconfig"},
    {"report"},
    {"evaluate", "download", "score", "export", "resume", "cluster.summarize"},
    {"train", "answer", "predict", "cluster.launch"},  # commands
    {"inspect_answers", "cluster.sweep"},  # commands built on commands
    {"cli"},  # the entry
    {"__main__"},  # python -m bert_squad
]
MAX_FUNCTION_LINES = 50


def modules():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if not name.endswith("__init__"):
            found[name] = ast.parse(path.read_text(), str(path))
    return found


def project_imports(tree, names):
    """Modules of the package that `tree` imports, anywhere in it."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_squad"):
            base = node.module.removeprefix("bert_squad").lstrip(".")
            out |= {n for n in [base, *(f"{base}.{a.name}".lstrip(".") for a in node.names)] if n in names}
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("bert_squad.") for a in node.names if a.name.startswith("bert_squad.")}
    return out


def functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_every_module_has_a_layer():
    layered = set().union(*LAYERS)
    assert set(modules()) == layered, f"add to LAYERS: {set(modules()) - layered}, gone: {layered - set(modules())}"


def test_imports_only_go_down_a_layer():
    found = modules()
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = [(m, t) for m, tree in found.items() for t in project_imports(tree, found)
              if t != m and layer[t] >= layer[m]]
    assert not upward, f"imports at or above the importer's layer: {upward}"


def test_no_function_is_longer_than_a_screen():
    long = [(path, f.name, f.end_lineno - f.lineno + 1) for path, tree in modules().items() for f in functions(tree)
            if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
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
