"""Thin shim: the click commands live in hasfl_ray/cli (installed as the `hasfl-ray` console script).

``python cli ...`` from the repository root runs the same CLI as ``hasfl-ray ...``.
"""

from hasfl_ray.cli.entry import main

if __name__ == "__main__":
    main()
