"""The sub-model league's rules (issue 44 item 2), one module per method, each transcribed from its authors' code
and tested against the source's expressions: FIARSE, FLuID, DepthFL, ScaleFL, and FedGMR (whose code could not be
read here: its module says what stands in for it).

Groundwork only: these are plain functions on tensors (masks, index sets, losses, aggregation weights) and each
method's options dataclass. No ``--algorithm`` name is registered and nothing here runs in an experiment yet: the
index-set, mask and depth layouts they need are being built separately (docs/algorithms.md, "The league's rules
(groundwork)").
"""
