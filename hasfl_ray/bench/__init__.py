"""The timing harnesses behind ``hasfl-ray bench`` (one module per subcommand), kept out of the library they time:
:mod:`hasfl_ray.bench.aggregate` times the fused aggregation against pure-torch implementations of the same result
(those in :mod:`hasfl_ray.bench.torch_aggregations`).
Nothing outside the command line imports this package."""
