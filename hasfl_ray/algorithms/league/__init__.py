"""The sub-model league's rules (issue 44 item 2), one module per method, each transcribed from its authors' code
and tested against the source's expressions: FIARSE, FLuID, DepthFL, ScaleFL, and FedGMR (whose code could not be
read here: its module says what stands in for it).

These are plain functions on tensors (masks, index sets, losses, aggregation weights) and each method's options
dataclass. DepthFL's and ScaleFL's run as ``--algorithm depthfl`` and ``scalefl`` (hasfl_ray/algorithms/depthfl.py,
scalefl.py); the others need the index-set and mask layouts, built separately (docs/algorithms.md, "The league's
rules").
"""
