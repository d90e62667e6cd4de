"""Inputs known by their content: the sha256 of every file a run reads beside its config, recorded in config.yaml as
``input_sha256`` so that --resume, a sweep's reuse and a report's rows notice a changed file:

- ``devices``: a device trace;
- ``dataset``, ``algorithm``, ``model``: a plug-in's source (its FILE.py, or the file of MODULE in MODULE:Class);
- ``<kind> imports <module>``: each module a plug-in imports, and they import in turn (their ``import`` statements),
  that is the user's own code: outside the standard library, site-packages and hasfl_ray (a module of the plug-in's
  own package counts even where that package is installed);
- ``dataset data <path>``: each file a dataset plug-in lists in ``data_files(config)`` (every file under a folder
  it lists).

What cannot be known so (a dataset plug-in that lists no data files, a plug-in without a source file) is said in one
sentence by :func:`unverified_inputs`: the run logs it and writes it to summary.json (``inputs_unverified``)."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import site
import sys
import sysconfig
from typing import Any, Dict, List, Optional, Tuple

#: Bytes read at a time while hashing (a trace of millions of devices is never held whole for its hash).
CHUNK = 1 << 20
#: The most modules followed from one plug-in (a package of the user's that imports a thousand of its own modules
#: is hashed up to here, and the rest said to be unverified).
MAX_MODULES = 500


def file_sha256(path: str) -> Optional[str]:
    """The sha256 of the file at ``path`` (None where there is no regular file to read: the reader says why). A
    config is resolved several times a run (and once a cell by a sweep): the file is read again only when its path,
    size or modification time changed."""
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    status = os.stat(path)
    return _sha256(os.path.realpath(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> Optional[str]:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(CHUNK), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def folder_sha256(path: str) -> Optional[str]:
    """One sha256 of every regular file under the folder ``path``: their paths relative to it and their contents'
    sha256, in sorted order (a file added, removed, renamed or edited changes it)."""
    digest = hashlib.sha256()
    for root, folders, files in os.walk(path):
        folders.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            content = file_sha256(full)
            if content is not None:
                digest.update(f"{os.path.relpath(full, path)}\0{content}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def input_hashes(config: Any) -> Optional[Dict[str, str]]:
    """``{input: sha256}`` of the files ``config`` reads (the module docstring); None when it reads none."""
    return _inputs(config)[0] or None


def unverified_inputs(config: Any) -> Optional[str]:
    """The one sentence saying which of ``config``'s inputs are known by their path only, or None."""
    reasons = _inputs(config)[1]
    if not reasons:
        return None
    return (f"{'; '.join(reasons)}: an edit to them between a stop and --resume, or between a sweep and one beside "
            "it, is not noticed")


def _inputs(config: Any) -> Tuple[Dict[str, str], List[str]]:
    found: Dict[str, str] = {}
    reasons: List[str] = []
    devices = getattr(config, "devices", None)
    trace = devices.get("trace") if isinstance(devices, dict) else devices if isinstance(devices, str) else None
    if isinstance(trace, str) and trace.strip().lower().endswith(".csv"):
        digest = file_sha256(trace.strip())
        if digest:
            found["devices"] = digest
    for key, path in (("devices", devices.get("fedscale") if isinstance(devices, dict) else None),
                      ("availability", getattr(config, "availability", None))):
        if isinstance(path, str) and (key == "devices" or path.startswith("fedscale:")):  # FedScale's pickles
            digest = file_sha256(path[len("fedscale:"):] if key == "availability" else path)
            if digest:
                found[key] = digest
    for key in ("dataset", "algorithm", "model"):
        spec = getattr(config, key, None)
        if isinstance(spec, str) and ":" in spec and not (key == "dataset" and spec.startswith("hf:")):
            _plugin_sources(key, spec, found, reasons)  # (hf: is hasfl_ray's own reader: only its data is hashed)
    spec = getattr(config, "dataset", None)
    if isinstance(spec, str) and ":" in spec:
        _data_files(config, spec, found, reasons)
    return found, reasons


# ---- a plug-in's source and the modules it imports ---------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _library_roots() -> Tuple[str, ...]:
    """Folders whose modules are not the user's: the standard library, site-packages, and hasfl_ray."""
    paths = sysconfig.get_paths()
    roots = [paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site module
        pass
    roots.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hasfl_ray
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots if r}))


def _under(path: str, roots: Tuple[str, ...]) -> bool:
    return any(path.startswith(root) for root in roots)


def _module_file(name: str) -> Optional[str]:
    """The source file of module ``name`` (None for a built-in, a namespace package, or one not found), looked up
    without running any code that the import of the plug-in did not run already."""
    module = sys.modules.get(name)
    if module is not None:
        path = getattr(module, "__file__", None)
    else:
        parent = name.rpartition(".")[0]
        if parent and parent not in sys.modules:
            return None  # finding it would import its package
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            return None
        path = spec.origin if spec is not None and spec.has_location else None
    return os.path.realpath(path) if isinstance(path, str) and os.path.isfile(path) else None


@functools.lru_cache(maxsize=1024)
def _imported_names(path: str, size: int, mtime_ns: int) -> Tuple[Tuple[str, int, Tuple[str, ...]], ...]:
    """(module, level, names) of every import statement in the Python file ``path`` (its functions' too)."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level, tuple(alias.name for alias in node.names)))
    return tuple(found)


def _candidates(path: str, package: Optional[str]) -> List[str]:
    """The names of the modules the file ``path`` imports (``import a.b`` imports ``a`` and ``a.b``; ``from a import
    b`` ``a``, and ``a.b`` where b is a module), relative imports resolved in ``package``."""
    status = os.stat(path)
    names: List[str] = []
    for module, level, members in _imported_names(path, status.st_size, status.st_mtime_ns):
        if level:
            if not package:
                continue  # a file loaded by its path is no package: its relative imports fail when it is imported
            try:
                module = importlib.util.resolve_name("." * level + module, package)
            except (ImportError, ValueError):
                continue
        parts = module.split(".") if module else []
        names += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        names += [f"{module}.{member}" for member in members if module and member != "*"]
    return names


def _plugin_sources(key: str, spec: str, found: Dict[str, str], reasons: List[str]) -> None:
    location = spec.rpartition(":")[0]
    by_path = location.endswith(".py") or os.sep in location or "/" in location
    path = os.path.realpath(location) if by_path and os.path.isfile(location) else None if by_path \
        else _module_file(location)
    digest = file_sha256(path) if path else None
    if digest is None:
        if not by_path:  # a missing FILE.py is refused by the registry, in its own sentence
            reasons.append(f"{key} {spec!r} has no source file to hash (a built-in or compiled module, or a class "
                           "defined where no file holds it)")
        return
    found[key] = digest
    own = ()  # the plug-in's own package, counted even where it is installed
    if not by_path:
        top = sys.modules.get(location.partition(".")[0])
        top_file = getattr(top, "__file__", None) if top is not None else None
        if isinstance(top_file, str) and os.path.basename(top_file).startswith("__init__."):
            own = (os.path.join(os.path.dirname(os.path.realpath(top_file)), ""),)
    roots, seen = _library_roots(), {path}
    queue = [(path, None if by_path else _package_of(location, path))]
    while queue:
        current, package = queue.pop(0)
        if not current.endswith(".py"):
            continue
        for name in _candidates(current, package):
            source = _module_file(name)
            if source is None or source in seen or (_under(source, roots) and not _under(source, own)):
                continue
            seen.add(source)
            if len(seen) > MAX_MODULES:
                reasons.append(f"{key} {spec!r} imports more than {MAX_MODULES} modules of its own (the rest are "
                               "not hashed)")
                return
            content = file_sha256(source)
            if content is not None:
                found[f"{key} imports {name}"] = content
                queue.append((source, _package_of(name, source)))


def _package_of(name: str, path: str) -> str:
    """The package relative imports in module ``name`` (file ``path``) resolve in."""
    module = sys.modules.get(name)
    package = getattr(module, "__package__", None) if module is not None else None
    if isinstance(package, str):
        return package
    return name if os.path.basename(path).startswith("__init__.") else name.rpartition(".")[0]


# ---- a dataset plug-in's data files -------------------------------------------------------------------------------

def _data_files(config: Any, spec: str, found: Dict[str, str], reasons: List[str]) -> None:
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.registry import call_plugin, lookup, spec_label

    plugin = lookup("dataset", spec)
    owner = f"dataset {spec_label(spec)!r}"
    instance = call_plugin(owner, "__init__", plugin, early=True)
    listed = call_plugin(owner, "data_files", lambda: instance.data_files(config), check=_paths,
                         expected="None or a list of file and folder paths", early=True)
    if listed is None:
        reasons.append(f"dataset {spec!r} does not list the files it reads (data_files() returns None), so they "
                       "are known by their path only")
        return
    for path in listed:
        digest = file_sha256(path) if os.path.isfile(path) else folder_sha256(path) if os.path.isdir(path) else None
        if digest is None:
            raise ConfigError(f"dataset {spec!r} lists {path!r} in data_files() but there is no such file or folder; "
                              "expected the files its load() reads (or None where it cannot list them)")
        found[f"dataset data {path}"] = digest


def _paths(value: Any) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not all(isinstance(p, (str, os.PathLike)) for p in value):
        raise TypeError("not a list of paths")
    return [os.fspath(p) for p in value]


def input_name(name: str, stored: Any) -> str:
    """An ``input_sha256`` key in words, for a sentence: ``devices file 'trace.csv'``, ``algorithm file
    'plug/p.py'``, ``module 'wmod' that the algorithm imports``, ``dataset data file 'my.csv'``."""
    kind, _, rest = name.partition(" ")
    if rest.startswith("imports "):
        return f"module {rest[len('imports '):]!r} that the {kind} imports"
    if rest.startswith("data "):
        return f"dataset data file {rest[len('data '):]!r}"
    source = stored.get(name) if hasattr(stored, "get") else None  # the trace's path, or the plug-in's spec
    source = source.get("trace", source.get("fedscale")) if isinstance(source, dict) else source
    if isinstance(source, str) and source.startswith("fedscale:"):
        return f"{name} file {source[len('fedscale:'):]!r}"
    if isinstance(source, str) and ":" in source:
        location = source.rpartition(":")[0]
        by_path = location.endswith(".py") or os.sep in location or "/" in location
        return f"{name} {'file' if by_path else 'module'} {location!r}"
    return f"{name} file {source!r}"


def changed_inputs(old: Any, new: Any) -> List[str]:
    """The ``input_sha256`` keys whose hash differs between a stored run's ``old`` and the current ``new``, in sorted
    order. A key the stored run lacks is a change unless that run predates its kind of hash: a plug-in's own key
    where the run hashed nothing of that plug-in (a MODULE:Class run of before), a module or data key where the
    plug-in's own source is unchanged (the same file imports the same modules and lists the same files)."""
    old, new = dict(old or {}), dict(new or {})
    changed = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        if name not in old:
            kind = name.partition(" ")[0]
            if name == kind and not any(k.partition(" ")[0] == kind for k in old) and kind != "devices":
                continue
            if name != kind and kind in old and old.get(kind) == new.get(kind):
                continue
        changed.append(name)
    return changed
