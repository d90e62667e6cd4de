// The dense CUDA op's constants (tile, warps, tuning), its kernels' arguments and warp sums: what dense_kernels.cuh,
// dense_reduce.cuh and aggregate_cuda.cu's host side share.
#pragma once

#include <cstdint>

#include "aggregate_layout.h"

namespace hasfl_ray {
namespace {

using namespace layout;

constexpr int kWarpSize = 32;
constexpr int kWarps = 8;  // warps per block
constexpr int kThreads = kWarps * kWarpSize;
// Tuning per element type, overridable at build time (-D...) to compare variants on a GPU. Unroll: the
// entries a warp has in flight at once (16 bytes per thread each); min blocks: the register budget
// (65536 / (min blocks x 256) per thread). ptxas for sm_90 (CUDA 13.0): float 2/4 -> 64 registers (52 bytes
// spilled), float 4/2 -> 110 registers (no spill), double 2/2 -> 112 registers (no spill).
#ifndef HASFL_CUDA_UNROLL_FLOAT
#define HASFL_CUDA_UNROLL_FLOAT 2
#endif
#ifndef HASFL_CUDA_MIN_BLOCKS_FLOAT
#define HASFL_CUDA_MIN_BLOCKS_FLOAT 4
#endif
#ifndef HASFL_CUDA_UNROLL_DOUBLE
#define HASFL_CUDA_UNROLL_DOUBLE 2
#endif
#ifndef HASFL_CUDA_MIN_BLOCKS_DOUBLE
#define HASFL_CUDA_MIN_BLOCKS_DOUBLE 2
#endif
template <typename scalar_t>
struct Tuning {
  static constexpr int kUnroll = sizeof(scalar_t) == 4 ? HASFL_CUDA_UNROLL_FLOAT : HASFL_CUDA_UNROLL_DOUBLE;
  static constexpr int kMinBlocks = sizeof(scalar_t) == 4 ? HASFL_CUDA_MIN_BLOCKS_FLOAT : HASFL_CUDA_MIN_BLOCKS_DOUBLE;
};
// Columns per lane (a multiple of 4: one 16-byte load of floats each 4): 4 gives items of 128 columns; 8 gives
// 256-column items, so each entry's row lookup and norm reduction serve twice the bytes (a variant to measure).
#ifndef HASFL_CUDA_COLS
#define HASFL_CUDA_COLS 4
#endif
constexpr int kColsPerLane = HASFL_CUDA_COLS;
static_assert(kColsPerLane == 4 || kColsPerLane == 8, "HASFL_CUDA_COLS must be 4 or 8 (a tile no wider than the block)");
constexpr int64_t kGpuTile = kWarpSize * kColsPerLane;  // 128 columns per item (at 4 per lane)
// The thread that computes the next item's row coordinates while the mean is formed: an idle one where the tile
// is narrower than the block, else the last thread, after its own column's mean.
constexpr int kRowThread = kGpuTile < kThreads ? static_cast<int>(kGpuTile) : kThreads - 1;
constexpr int64_t kGpuChunkElems = 1024;  // 8 full items per chunk: many chunks, so blocks end together
// Entries per parameter whose norm slots live in shared memory: static shared memory is 2 x 8 warps x tile
// doubles, and static + dynamic stay under the 48 KiB that needs no opt-in.
constexpr int64_t kMaxSharedSlots = kColsPerLane == 4 ? 1536 : 512;
constexpr int kReduceThreads = 128;
// Index arithmetic inside a parameter (rows, columns, items, packed offsets) is done in idx_t: int32_t when every
// parameter has fewer than kIndex32Limit elements (then so has every packed tensor), int64_t otherwise; output
// offsets and norm slots stay 64-bit. On an H100 the 32-bit kernel has no register spills at 64 registers and was
// 1.20-1.26x faster at 50/200 EMNIST clients and 1.24-1.26x for the LSTM (benchmarks/RESULTS.md, 2026-11-27).
// HASFL_CUDA_FORCE_INDEX64=1 at build time keeps the 64-bit kernel for every call (to compare the two).
#ifndef HASFL_CUDA_FORCE_INDEX64
#define HASFL_CUDA_FORCE_INDEX64 0
#endif
constexpr int64_t kIndex32Limit = (int64_t{1} << 31) - 4 * kGpuTile;  // room for a tile and an unrolled entry step
template <typename T>
__device__ __forceinline__ T lesser(T a, T b) { return a < b ? a : b; }

struct CudaArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const int64_t* param_chunk_begin;
  const int64_t* data;        // per entry: address of its packed tensor
  const int64_t* vector_ok;   // per entry: 1 when its rows are 16-byte aligned and its last dim is not rolled
  const double* entry_weight; // per entry: its client's weight
  void* out;
  double* partial_num;  // per parameter p: [partial base of its first chunk + local entry * chunks of p + local chunk]
  double* partial_den;
  int64_t* chunk_covered;
  unsigned long long* next_chunk;  // work counter, 0 at launch
  int64_t num_chunks;
  int64_t shared_slots;  // capacity of the dynamic shared memory, in entries (num and den each)
};

__device__ __forceinline__ double warp_sum(double value) {
#pragma unroll
  for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}

__device__ __forceinline__ int64_t warp_sum(int64_t value) {
#pragma unroll
  for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}

}  // namespace
}  // namespace hasfl_ray
