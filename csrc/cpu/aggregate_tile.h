// Per-tile steps that the dense (aggregate_cpu_kernel.h) and sparse (aggregate_sparse_kernel.h) CPU kernels share,
// defined once. No include guard on purpose: aggregate_cpu.cpp includes it once in each build namespace (avx2,
// avx512, generic), with HASFL_TILE_TARGET set to that namespace's target attribute so the kernels inline it.
// It must include nothing itself.

// acc[0, n) and den[0, n) = 0: the tile's weighted sums and covering weights before pass 1.
HASFL_TILE_TARGET inline void clear_tile_sums(double* acc, double* den, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] = 0.0;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) den[j] = 0.0;
}

// The one NaN a mean is written as (+, quiet, payload 0): which of two NaN operands an add returns is the first
// operand's, and compilers swap an add's operands at will, so -NaN + NaN is -NaN in one build and NaN in another.
inline constexpr double kCanonicalNan = __builtin_nan("");

// mean[j] = acc[j] / den[j] where den[j] > 0 (some entry covers column j), else 0, kCanonicalNan where that is a NaN;
// out[j] = mean[j] rounded to scalar_t. Returns how many columns are covered.
template <typename scalar_t>
HASFL_TILE_TARGET inline int64_t write_tile_mean(const double* acc, const double* den, int64_t n, double* mean,
                                                 scalar_t* out) {
  int64_t covered = 0;
#pragma omp simd reduction(+ : covered)
  for (int64_t j = 0; j < n; ++j) {
    const bool any = den[j] > 0.0;
    const double q = any ? acc[j] / den[j] : 0.0;
    const double m = q != q ? kCanonicalNan : q;
    mean[j] = m;
    out[j] = static_cast<scalar_t>(m);
    covered += any ? 1 : 0;
  }
  return covered;
}

// out[0, n) = 0: a tile no entry covers.
template <typename scalar_t>
HASFL_TILE_TARGET inline void write_tile_zeros(scalar_t* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = scalar_t(0);
}
