// The sparse CUDA kernels' shared pieces (aggregate_sparse_cuda.cu's aggregate_sparse_into and
// aggregate_private_cuda.cu's private ops): the work split's constants, where an entry holds a row and a column
// (dense kind 0: local_row and local_column; sparse kind 1: the row maps and the tile's bitmask), the fixed warp sum
// and the per-client reduction of the divergence partials. `Args` is either kernel's argument struct (the members
// entries, row_map, row_map_begin, bits, bits_at, tile_prefix and prefix_begin).
#pragma once

#include <cstdint>

#include "aggregate_layout.h"
#include "cuda/canonical_nan.cuh"

namespace hasfl_ray {
namespace {

using namespace layout;

constexpr int kSparseWarps = 4;
constexpr int kSparseThreads = 32 * kSparseWarps;
constexpr int64_t kSparseTile = kSparseThreads;  // one column per thread
constexpr int64_t kSparseChunkElems = 1024;

__device__ __forceinline__ double sparse_warp_sum(double value) {
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}

// Where entry e holds row `row`: the element offset of that row in its packed tensor, or -1 (uniform per block).
template <typename Args>
__device__ int64_t sparse_row_start(const Args& a, const int64_t* param, bool sparse, int64_t e,
                                    int64_t row) {
  const int64_t* entry = a.entries + e * kEntryCols;
  const int64_t ndim = param[kParamNdim];
  if (!sparse) {
    const int64_t local = local_row(param, entry, row);
    return local < 0 ? -1 : local * entry[kEntryPacked + ndim - 1];
  }
  const int64_t local = mapped_local_row(a.row_map, a.row_map_begin, param, e, entry, row);
  return local < 0 ? -1 : local * entry[kEntryPacked + ndim - 1];
}

// Column j's rank among the set bits of a tile's bitmask (lo: columns 0-63, hi: 64-127), or -1 where j's is clear.
__device__ __forceinline__ int tile_rank(uint64_t lo, uint64_t hi, int j) {
  const uint64_t word = j < 64 ? lo : hi;
  const int bit = j & 63;
  if (!((word >> bit) & 1ull)) return -1;
  return __popcll(word & ((1ull << bit) - 1ull)) + (j < 64 ? 0 : __popcll(lo));
}

// The element of entry e at column c0 + j of a row starting at `start`, or -1 where the entry does not hold it.
template <typename Args>
__device__ int64_t sparse_element(const Args& a, const int64_t* param, bool sparse, int64_t e,
                                  int64_t start, int64_t tile, int64_t c0, int j) {
  const int64_t* entry = a.entries + e * kEntryCols;
  const int64_t ndim = param[kParamNdim];
  if (!sparse) {
    const int64_t column = local_column(c0 + j, entry[kEntryOffset + ndim - 1], entry[kEntryPacked + ndim - 1],
                                        row_length(param));
    return column < 0 ? -1 : start + column;
  }
  const uint8_t* m = a.bits + a.bits_at[e] + c0 / 8;  // 16-byte aligned: c0 is a multiple of 128
  const uint64_t lo = reinterpret_cast<const uint64_t*>(m)[0], hi = reinterpret_cast<const uint64_t*>(m)[1];
  const int below = tile_rank(lo, hi, j);
  return below < 0 ? -1 : start + a.tile_prefix[a.prefix_begin[e] + tile] + below;
}

// Per client: its entries in parameter order, each entry's chunks in order, each chunk's warps in order; a NaN sum
// as canonical_nan.
__global__ void sparse_reduce_kernel(const int64_t* params, const int64_t* entries, const int64_t* chunks,
                                     const int64_t* param_chunk_begin, const int64_t* client_entry_begin,
                                     const int64_t* client_entries, const double* partial_num,
                                     const double* partial_den, int64_t num_clients, double* div_num,
                                     double* div_den) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_clients) return;
  double num = 0.0, den = 0.0;
  for (int64_t k = client_entry_begin[i]; k < client_entry_begin[i + 1]; ++k) {
    const int64_t e = client_entries[k];
    const int64_t p = entries[e * kEntryCols + kEntryParam];
    const int64_t local = e - params[p * kParamCols + kParamEntryBegin];
    double entry_num = 0.0, entry_den = 0.0;
    for (int64_t c = param_chunk_begin[p]; c < param_chunk_begin[p + 1]; ++c) {
      const int64_t slot = (chunks[c * kChunkCols + kChunkPartialBase] + local) * kSparseWarps;
      for (int w = 0; w < kSparseWarps; ++w) {
        entry_num += partial_num[slot + w];
        entry_den += partial_den[slot + w];
      }
    }
    num += entry_num;
    den += entry_den;
  }
  div_num[i] = canonical_nan(num);  // as the CPU's reduce_results writes a NaN
  div_den[i] = canonical_nan(den);
}

}  // namespace
}  // namespace hasfl_ray
