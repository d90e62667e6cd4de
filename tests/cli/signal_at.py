"""Run `hasfl-ray` (its console script's code path, hasfl_ray.cli.entry) with a signal sent to itself at a named
point of its start-up, so a test lands the signal where it means to on any machine, never where a timer happens to.

    python signal_at.py SIGNAL WHEN -- ARGUMENTS...

SIGNAL is SIGINT or SIGTERM, ``SIGTERM*2`` sends it twice in a row. WHEN is

- ``import:MODULE``: while MODULE is being imported, as its own code starts to run (so inside the import of its
  parent package too, when MODULE is a submodule: ``import:numpy._core._multiarray_umath`` lands in the middle of
  ``import numpy``, wherever that import comes from);
- ``call:MODULE:NAME``: as NAME (an attribute of MODULE, dotted for a method: ``Engine._loop``) is first called,
  from whichever thread calls it; ``call:MODULE:NAME@N``: as it is called the N-th time.

The signal is raised in the calling thread (:func:`signal.raise_signal`), so the process's handlers see it at
that point, before the next line of the import or the call runs. Only the first import or call fires; a point
that never came ends the process with status 99 and a line saying so. Standard library only, and nothing is
imported before the command starts but what the console script itself imports."""

import importlib.abc
import importlib.util
import signal
import sys


def _parse(argv):
    name, when = argv[0], argv[1]
    assert argv[2] == "--", argv
    number, _, times = name.partition("*")
    return getattr(signal, number), int(times or 1), when, argv[3:]


NUMBER, TIMES, WHEN, ARGUMENTS = _parse(sys.argv[1:])
KIND, _, TARGET = WHEN.partition(":")
assert KIND in ("import", "call"), WHEN
fired = []


def fire():
    if not fired:
        fired.append(True)
        for _ in range(TIMES):
            signal.raise_signal(NUMBER)


class Loader(importlib.abc.Loader):
    """The module's own loader, with the signal first (``import:``) or the call's wrapper set after (``call:``)."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        if KIND == "import":
            fire()
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        if KIND == "import":
            return
        owner, (attribute, _, nth) = module, TARGET.split(":")[1].partition("@")
        calls = []
        *path, last = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, last)

        def wrapper(*args, **kwargs):
            calls.append(True)
            if len(calls) == int(nth or 1):
                fire()
            return original(*args, **kwargs)

        setattr(owner, last, wrapper)


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET.split(":")[0]:
            return None
        sys.meta_path.remove(self)  # the real finders find it, this one wraps its loader
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        spec.loader = Loader(spec.loader)
        return spec


sys.meta_path.insert(0, Finder())
sys.argv = ["hasfl-ray"] + ARGUMENTS

from hasfl_ray.cli.entry import main  # noqa: E402 (the console script's own import)

try:
    main()
    code = 0
except SystemExit as exit:
    code = exit.code
if not fired:  # the point named never came: the test would prove nothing
    sys.stderr.write(f"signal_at: {WHEN} never came\n")
    code = 99
sys.exit(code)
