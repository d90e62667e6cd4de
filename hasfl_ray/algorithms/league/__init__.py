"""The sub-model league's rules (issue 44 item 2), one module per method, each transcribed from its authors' code
and tested against the source's expressions: FIARSE, FLuID, DepthFL, ScaleFL, and FedGMR (whose code could not be
read here: its module says what stands in for it).

Plain functions on tensors (masks, index sets, losses, aggregation weights) and each method's options dataclass.
Every method runs as an ``--algorithm``: ``fluid`` (:mod:`hasfl_ray.algorithms.fluid`, on channel index sets),
``depthfl`` and ``scalefl`` (hasfl_ray/algorithms/depthfl.py, scalefl.py, on depth sub-models), ``fiarse`` and
``fedgmr`` (:mod:`hasfl_ray.algorithms.fiarse`, :mod:`hasfl_ray.algorithms.fedgmr`, on parameter masks);
docs/algorithms.md, "The league's rules".
"""
