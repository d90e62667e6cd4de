// The CPU builds' NaN (csrc/cpu/aggregate_tile.h's kCanonicalNan: quiet, positive, no payload) on CUDA, where a NaN's
// bits depend on the instruction that made it (a division or conversion gives 0x7FFF...): a mean or norm that is a
// NaN is written as the CPU writes it, so a NaN result reads alike from run to run, kernel to kernel and device to
// device.
#pragma once

namespace hasfl_ray {
namespace {

__device__ __forceinline__ double canonical_nan(double value) {
  return value != value ? __longlong_as_double(0x7FF8000000000000LL) : value;
}

// A mean (already canonical_nan's) as the output's type: float32's NaN as the CPU's conversion of kCanonicalNan
// gives it.
template <typename scalar_t>
__device__ __forceinline__ scalar_t mean_out(double mean) {
  return static_cast<scalar_t>(mean);
}
template <>
__device__ __forceinline__ float mean_out<float>(double mean) {
  return mean != mean ? __int_as_float(0x7FC00000) : static_cast<float>(mean);
}

}  // namespace
}  // namespace hasfl_ray
