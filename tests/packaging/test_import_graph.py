"""Layering: no import circles among hasfl_ray's modules, the command line (hasfl_ray/cli) included: its commands are
plain click commands that cli/main.py adds to the group, and none imports the group. Every import is counted: those
inside functions and those under ``if TYPE_CHECKING:`` too (a type-only import still points one module at another:
the arrows of the layering must point one way for type checkers as for the interpreter).

The floors of the house (:data:`FLOORS`, bottom first): no module imports a module of a higher floor."""

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
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(tree):  # every import statement, `if TYPE_CHECKING:` bodies included
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


def test_no_import_circles():
    modules = module_names()
    graph = {name: set(imports(path, name, modules)) for name, path in modules.items()}
    # a package imports its own modules (that is how built-ins register); a module importing its parent package's
    # names is counted as importing that package, which then closes a circle only through a real back edge
    assert cycles(graph) == []


def test_the_run_configuration_knows_no_algorithm_or_dataset():
    modules = module_names()
    config = set(imports(modules["hasfl_ray.engine.config"], "hasfl_ray.engine.config", modules))
    assert not any(m.startswith(("hasfl_ray.algorithms", "hasfl_ray.data", "hasfl_ray.simulation")) for m in config)
    registry = set(imports(modules["hasfl_ray.registry"], "hasfl_ray.registry", modules))
    assert registry <= {"hasfl_ray.errors", "hasfl_ray.files"}  # files: the FIFO check of a plug-in's FILE.py
    assert set(imports(modules["hasfl_ray.files"], "hasfl_ray.files", modules)) <= {"hasfl_ray.errors"}


def test_type_checking_imports_are_counted(tmp_path):
    """A circle closed only under ``if TYPE_CHECKING:`` is still a circle."""
    path = tmp_path / "b.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n")
    assert list(imports(str(path), "pkg.b", {"pkg.a": "", "pkg.b": str(path)})) == ["pkg.a"]
    assert cycles({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}) == [["pkg.a", "pkg.b"]]


def test_training_layers_point_one_way():
    """training/: task and result at the bottom, then step, graphed and workspace, eager and batched, the trainer
    on top; hasfl_ray.training.local only re-exports. No training module imports one above it."""
    modules = module_names()
    order = ["result", "seeding", "step", "task", "graphed", "workspace", "eager", "batched", "trainer", "local"]
    for position, low in enumerate(order):
        name = f"hasfl_ray.training.{low}"
        above = {f"hasfl_ray.training.{m}" for m in order[position + 1:]}
        assert not set(imports(modules[name], name, modules)) & above, name


def test_the_engine_names_no_single_algorithm_and_the_schedule_sits_at_the_bottom():
    """The engine finds algorithms through the registry (hasfl_ray.algorithms), never one algorithm's module; the
    adaptation schedule both read is hasfl_ray.schedule, which imports nothing of hasfl_ray; and random-budget's
    budget_from_run lives with random-budget, not in the run configuration."""
    modules = module_names()
    for name in (m for m in modules if m.startswith("hasfl_ray.engine")):
        assert not {m for m in imports(modules[name], name, modules)
                    if m.startswith("hasfl_ray.algorithms.")}, name
    assert set(imports(modules["hasfl_ray.schedule"], "hasfl_ray.schedule", modules)) == set()
    import hasfl_ray.engine.config as config

    assert not hasattr(config, "budget_from_run")


#: The floors of hasfl_ray, bottom first, as names relative to the package: an entry is a module or a package (with
#: everything under it; the most specific entry wins), ``PKG.__init__`` a package's own ``__init__.py`` alone and
#: ``__init__`` hasfl_ray's. A module may import its own floor and those below (circles are test_no_import_circles'
#: business), never one above. Entries of a package placed on another floor than the package's:
#:
#: - ``training.seeding`` (random streams, imports nothing of hasfl_ray) on the bottom floor: the clock's traces and
#:   the synthetic dataset draw from it;
#: - ``engine.config`` (the run configuration, becoming ``config/``) on the floor of the parts it configures;
#: - ``engine.__init__``, ``engine.engine`` and ``engine.factory`` (the run: the Engine and the backend it picks) above
#:   the Ray backend, which implements the engine's backend interface on its server: the engine's other modules stay
#:   below it, and ``engine.factory`` imports ``simulation`` only for ``backend: ray``;
#: - ``simulation.sweep`` (the sweep's Ray executor) on the sweep's floor, whose cells it runs.
FLOORS = (
    ("bottom", ("errors", "files", "schedule", "registry", "federation", "evaluation", "training.seeding",
                "interrupts", "callbacks", "trackers", "threads", "allocator", "front_end")),
    ("parts", ("config", "engine.config", "models", "aggregation", "ops", "data", "clock")),
    ("training", ("training",)),
    ("algorithms", ("algorithms",)),
    ("engine", ("engine",)),
    ("simulation", ("simulation",)),
    ("run", ("engine.__init__", "engine.engine", "engine.factory")),
    ("analysis", ("analysis",)),
    ("sweep", ("sweep", "simulation.sweep")),
    ("bench", ("bench",)),
    ("top", ("cli", "api", "results", "flower", "__init__")),
)

#: Floor entries that may not exist yet (the configuration package is being moved out of engine/config.py).
OPTIONAL_ENTRIES = {"config"}


def floor_of(name, is_package):
    """The index in :data:`FLOORS` of module ``name`` (dotted, ``hasfl_ray`` included), or None if it has none."""
    entries = {entry: index for index, (_, names) in enumerate(FLOORS) for entry in names}
    relative = name.split(".")[1:]
    candidates = [".".join(relative + ["__init__"])] if is_package else []
    candidates += [".".join(relative[:end]) for end in range(len(relative), 0, -1)]
    return next((entries[c] for c in candidates if c in entries), None)


def floors():
    modules = module_names()
    return modules, {name: floor_of(name, path.endswith("__init__.py")) for name, path in modules.items()}


def test_every_module_has_a_floor_and_every_floor_entry_exists():
    modules, floor = floors()
    assert [name for name, index in floor.items() if index is None] == []
    relative = {".".join(name.split(".")[1:]) for name in modules}
    packages = {".".join(name.split(".")[1:] + ["__init__"]) for name, path in modules.items()
                if path.endswith("__init__.py")}
    entries = [entry for _, names in FLOORS for entry in names]
    assert len(entries) == len(set(entries))
    assert [e for e in entries if e not in relative | packages and e not in OPTIONAL_ENTRIES] == []


def test_no_import_up():
    """No module imports one of a higher floor (every import counted, as for circles)."""
    modules, floor = floors()
    upward = sorted(f"{name} ({FLOORS[floor[name]][0]}) -> {target} ({FLOORS[floor[target]][0]})"
                    for name, path in modules.items() for target in imports(path, name, modules)
                    if floor[target] > floor[name])
    assert upward == []


def test_floor_of_takes_the_most_specific_entry():
    assert FLOORS[floor_of("hasfl_ray.training.seeding", False)][0] == "bottom"
    assert FLOORS[floor_of("hasfl_ray.training.trainer", False)][0] == "training"
    assert FLOORS[floor_of("hasfl_ray.engine", True)][0] == "run"
    assert FLOORS[floor_of("hasfl_ray.engine.server", False)][0] == "engine"
    assert FLOORS[floor_of("hasfl_ray", True)][0] == "top"
    assert floor_of("hasfl_ray.nowhere", False) is None


def test_no_file_of_the_package_is_over_400_lines():
    """Issue 36 item 4's measure of a file a reader can hold: at most 400 lines."""
    long = {name: n for name, path in module_names().items()
            if (n := sum(1 for _ in open(path, encoding="utf-8"))) > 400}
    assert long == {}
