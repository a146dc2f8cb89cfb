"""The import graph (every `import rllava...` in the library, at module level or inside a function): no circle,
and the layers below the training loop (algorithms, data, model, engine, reward, roles, agent, config) never import
`rllava.train`, `rllava.commands` or `rllava.api` (issue 56: the judge reward reached up into train/builders)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rllava"
TOP = ("rllava.train", "rllava.commands", "rllava.api")


def _graph() -> dict[str, set[str]]:
    """Module -> the rllava modules it imports (`from pkg import mod` counts as the module when it is one)."""
    names = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
             for p in ROOT.rglob("*.py")}
    graph = {}
    for name in names:
        path = ROOT.parent / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT.parent / name.replace(".", "/") / "__init__.py"
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                           for a in node.names)
        graph[name] = {m for m in out if m in names and m != name}
    return graph


def test_no_module_imports_a_layer_above_it():
    bad = [(m, t) for m, ts in _graph().items() if not m.startswith(TOP) and m != "rllava"
           for t in ts if t.startswith(TOP)]
    assert not bad, f"lower layers import the training loop or the commands: {bad}"


def test_the_import_graph_has_no_circle():
    graph, state, path = _graph(), {}, []

    def visit(m):  # depth first; a module met again while on the path closes a circle
        state[m] = "open"
        path.append(m)
        for t in sorted(graph[m]):
            assert state.get(t) != "open", f"import circle: {' -> '.join(path[path.index(t):] + [t])}"
            if t not in state:
                visit(t)
        path.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
