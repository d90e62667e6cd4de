// The dense CUDA op's reductions (after dense_kernels.cuh's chunk kernel): per entry its chunks' partials, per client
// its entries; a NaN sum as canonical_nan.
#pragma once

#include <cstdint>

#include "cuda/dense_kernels.cuh"

namespace hasfl_ray {
namespace {

// Per entry (a block each), its chunks' partials: thread t adds chunks t, t + 128, ... in order, then a
// fixed tree (xor shuffles, then the warps in order). The same order on every run.
__global__ void __launch_bounds__(kReduceThreads) reduce_entries_kernel(const int64_t* params, const int64_t* entries,
                                                                        const int64_t* chunks,
                                                                        const int64_t* param_chunk_begin,
                                                                        const double* partial_num,
                                                                        const double* partial_den, double* entry_num,
                                                                        double* entry_den) {
  __shared__ double s_sums[2][kReduceThreads / kWarpSize];
  const int64_t e = blockIdx.x;
  const int64_t p = entries[e * kEntryCols + kEntryParam];
  const int64_t k = e - params[p * kParamCols + kParamEntryBegin];
  const int64_t first = param_chunk_begin[p], count = param_chunk_begin[p + 1] - first;
  double num = 0.0, den = 0.0;
  if (count > 0) {
    const int64_t base = chunks[first * kChunkCols + kChunkPartialBase] + k * count;
    for (int64_t j = threadIdx.x; j < count; j += kReduceThreads) {
      num += partial_num[base + j];
      den += partial_den[base + j];
    }
  }
  num = warp_sum(num);
  den = warp_sum(den);
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
    s_sums[0][warp] = num;
    s_sums[1][warp] = den;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total_num = 0.0, total_den = 0.0;
    for (int w = 0; w < kReduceThreads / kWarpSize; ++w) {
      total_num += s_sums[0][w];
      total_den += s_sums[1][w];
    }
    entry_num[e] = total_num;
    entry_den[e] = total_den;
  }
}

// Per client, its entries in parameter order.
__global__ void reduce_clients_kernel(const int64_t* client_entry_begin, const int64_t* client_entries,
                                      const double* entry_num, const double* entry_den, int64_t num_clients,
                                      double* div_num, double* div_den) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_clients) return;
  double num = 0.0, den = 0.0;
  for (int64_t k = client_entry_begin[i]; k < client_entry_begin[i + 1]; ++k) {
    num += entry_num[client_entries[k]];
    den += entry_den[client_entries[k]];
  }
  div_num[i] = canonical_nan(num);
  div_den[i] = canonical_nan(den);
}

}  // namespace
}  // namespace hasfl_ray
