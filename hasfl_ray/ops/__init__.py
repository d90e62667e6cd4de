"""Typed Python wrappers of the compiled operators in ``hasfl_ray._C`` (namespace ``torch.ops.hasfl_ray``)."""

from hasfl_ray.ops.aggregate import AggregateLayout, aggregate_fused, available, build_layout, cuda_available

__all__ = ["AggregateLayout", "aggregate_fused", "available", "build_layout", "cuda_available"]
