"""hasfl-ray: HAS-FL and its baselines, simulated on Ray actors with a fused aggregation kernel."""

from hasfl_ray.aggregation import AggregateResult, aggregate_updates

__version__ = "0.1.0"

__all__ = ["AggregateResult", "aggregate_updates", "__version__"]
