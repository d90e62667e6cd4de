"""Layering: no import circles among hasfl_ray's modules (the click command group, hasfl_ray/cli, aside), with every
import counted, including those inside functions; only ``if TYPE_CHECKING:`` blocks are left out."""

import ast
import os

import hasfl_ray

PACKAGE = os.path.dirname(os.path.abspath(hasfl_ray.__file__))


def module_names():
    names = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                names[".".join(parts)] = path
    return names


def imports(path, name, modules):
    tree = ast.parse(open(path, encoding="utf-8").read())
    skipped = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` bodies never run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        yield from (t for t in targets if t in modules and t != name)


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_outside_the_command_group():
    modules = {n: p for n, p in module_names().items() if not n.startswith("hasfl_ray.cli")}
    graph = {name: set(imports(path, name, modules)) for name, path in modules.items()}
    # a package imports its own modules (that is how built-ins register); a module importing its parent package's
    # names is counted as importing that package, which then closes a circle only through a real back edge
    assert cycles(graph) == []


def test_the_run_configuration_knows_no_algorithm_or_dataset():
    modules = module_names()
    config = set(imports(modules["hasfl_ray.engine.config"], "hasfl_ray.engine.config", modules))
    assert not any(m.startswith(("hasfl_ray.algorithms", "hasfl_ray.data", "hasfl_ray.simulation")) for m in config)
    registry = set(imports(modules["hasfl_ray.registry"], "hasfl_ray.registry", modules))
    assert registry <= {"hasfl_ray.errors"}
