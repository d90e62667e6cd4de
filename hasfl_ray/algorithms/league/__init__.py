"""The sub-model league's rules (issue 44 item 2), one module per method, each transcribed from its authors' code
and tested against the source's expressions: FIARSE, FLuID, DepthFL, ScaleFL, and FedGMR (whose code could not be
read here: its module says what stands in for it).

These are plain functions on tensors (masks, index sets, losses, aggregation weights) and each method's options
dataclass. FIARSE's and FedGMR's run as ``--algorithm fiarse`` and ``fedgmr`` (:mod:`hasfl_ray.algorithms.fiarse`,
:mod:`hasfl_ray.algorithms.fedgmr`, on parameter masks); the others are not wired into a run yet (docs/algorithms.md,
"The league's rules (groundwork)").
"""
