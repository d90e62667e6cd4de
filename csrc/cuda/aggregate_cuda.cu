// CUDA implementation of hasfl_ray::aggregate_into: persistent blocks, a block per item, entries split
// over its warps, 16-byte loads.
//
// Same descriptor, same index arithmetic (csrc/aggregate_layout.h), same work split into chunks
// (make_plan with kGpuTile = 128 columns, kGpuChunkElems = 1024 coordinates), same definition of the
// result. Mapping:
//   grid:   as many blocks of 256 threads as fit on the card at once (occupancy x SM count); each block
//           takes the next chunk from an integer work counter until none is left (the counter only hands
//           out work: every chunk's result is the same whichever block computes it).
//   item:   one row and a tile of <= 128 columns of its last dim, done by the whole block. Lane l of every
//           warp owns columns c0 + 4l .. c0 + 4l + 3; warp w takes the item's entries w, w + 8, w + 16, ...
//           (kUnroll of them in flight at once), each a 16-byte load (float4, or two double2) where the
//           entry's rows are 16-byte aligned and the 4 columns lie inside its window, else 4 scalar loads.
//   pass 1: per warp and column, the weighted sum and the covering weight of its entries, in entry order;
//           the 8 warps' sums are added in warp order through shared memory; mean = acc / den (0 where no
//           entry covers), written to out (consecutive threads, consecutive columns) and to shared memory.
//   pass 2: each warp re-reads the same entries (the bytes it has just read, from L1/L2), per entry a warp
//           sum (fixed xor-shuffle tree) of (x - mean)^2 and mean^2 over its columns, added by lane 0 to
//           the entry's norm slot. An entry always belongs to the same warp, so a slot has one writer.
//   chunk:  slots (shared memory, or for parameters with > kMaxSharedSlots entries the partials in global
//           memory) start at 0 and are written as this chunk's partials, entry-major per parameter.
//   then:   a block per entry sums its chunks' partials (fixed strided split + fixed tree), a thread per
//           client its entries in parameter order.
//   index:  row, column and item arithmetic in 32 bits where every parameter has < 2^31 elements (the usual
//           case: no register spills at 64 registers), else in 64 bits: two instantiations, chosen per call.
// No float atomics: deterministic from run to run on a given GPU; not bit-identical to the CPU kernel
// (other summation order). All tables go to the device in one copy from pinned memory.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // not ATen/cuda/CUDAContext.h: that one needs the cuSPARSE/cuBLAS headers
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <tuple>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "cuda/canonical_nan.cuh"

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

// kColsPerLane consecutive values from a 16-byte aligned address (16 bytes per load).
__device__ __forceinline__ void load4(const float* x, float v[kColsPerLane]) {
#pragma unroll
  for (int k = 0; k < kColsPerLane; k += 4) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(x + k));
    v[k] = q.x;
    v[k + 1] = q.y;
    v[k + 2] = q.z;
    v[k + 3] = q.w;
  }
}

__device__ __forceinline__ void load4(const double* x, double v[kColsPerLane]) {
#pragma unroll
  for (int k = 0; k < kColsPerLane; k += 2) {
    const double2 a = __ldg(reinterpret_cast<const double2*>(x + k));
    v[k] = a.x;
    v[k + 1] = a.y;
  }
}

// Global coordinates g[0 .. ndim - 2] of row `row` (row-major over all dims but the last): local_row's
// decomposition, done once per item instead of once per entry.
template <typename idx_t>
__device__ __forceinline__ void row_coordinates(const int64_t* param, idx_t ndim, idx_t row, idx_t* g) {
  for (idx_t d = ndim - 2; d >= 0; --d) {
    const idx_t full = static_cast<idx_t>(param[kParamFull + d]);  // >= 1: a parameter with items has no empty dim
    g[d] = row % full;
    row /= full;
  }
}

// The row of entry `e` that holds the item (global row coordinates g[0..ndim-2], columns [c0, c1)), or
// nullptr when the entry does not cover the row or its last-dim window misses the tile. Same arithmetic
// as local_row (Horner form of its sum) and window_pieces; the same for every thread of the block.
template <typename scalar_t, typename idx_t>
__device__ __forceinline__ const scalar_t* entry_row(const CudaArgs& a, const int64_t* param, idx_t ndim,
                                                     const idx_t* g, idx_t e, idx_t length, idx_t c0, idx_t c1) {
  const int64_t* entry = a.entries + static_cast<int64_t>(e) * kEntryCols;
  idx_t local = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims - 1; ++d) {
    if (d + 1 < ndim) {
      const idx_t full = static_cast<idx_t>(param[kParamFull + d]);
      idx_t index = g[d] - static_cast<idx_t>(entry[kEntryOffset + d]);
      if (index < 0) index += full;
      const idx_t packed = static_cast<idx_t>(entry[kEntryPacked + d]);
      if (index >= packed) return nullptr;
      local = local * packed + index;
    }
  }
  const idx_t offset = static_cast<idx_t>(entry[kEntryOffset + ndim - 1]);
  const idx_t width = static_cast<idx_t>(entry[kEntryPacked + ndim - 1]);
  const idx_t wrapped_end = offset + width - length;  // window_meets, in idx_t
  const bool meets = (wrapped_end > 0 && (c0 > 0 ? c0 : 0) < (wrapped_end < c1 ? wrapped_end : c1)) ||
                     (offset > c0 ? offset : c0) < lesser(lesser(offset + width, length), c1);
  if (!meets) return nullptr;
  return reinterpret_cast<const scalar_t*>(a.data[e]) + static_cast<int64_t>(local) * width;
}

// The entry's values at the thread's columns c .. c + 3 (0 where it holds none) and a bit per column it
// holds. Vector path: 16-byte aligned rows, window [0, width) (offset 0), and all 4 columns inside it
// (then c + 4 <= width <= length and c + 4 <= c0 + kGpuTile, so also c + 4 <= c1).
template <typename scalar_t, typename idx_t>
__device__ __forceinline__ unsigned load_columns(const CudaArgs& a, const scalar_t* row, idx_t e, idx_t ndim,
                                                 idx_t length, idx_t c, idx_t c1, scalar_t v[kColsPerLane]) {
  const int64_t* entry = a.entries + static_cast<int64_t>(e) * kEntryCols;
  const idx_t offset = static_cast<idx_t>(entry[kEntryOffset + ndim - 1]);
  const idx_t width = static_cast<idx_t>(entry[kEntryPacked + ndim - 1]);
  if (a.vector_ok[e] && c + kColsPerLane <= width) {
    load4(row + c, v);
    return (1u << kColsPerLane) - 1;
  }
  unsigned mask = 0;
#pragma unroll
  for (int q = 0; q < kColsPerLane; ++q) {
    idx_t l = -1;
    if (c + q < c1) {  // local_column, in idx_t
      l = c + q - offset;
      if (l < 0) l += length;
      if (l >= width) l = -1;
    }
    v[q] = l >= 0 ? __ldg(row + l) : scalar_t(0);
    mask |= l >= 0 ? 1u << q : 0u;
  }
  return mask;
}

// What a block needs to know of its current chunk; written by thread 0 when it takes the chunk and read
// from shared memory where used (keeps registers for the loads in flight).
template <typename idx_t>
struct ChunkContext {
  const int64_t* param;
  int64_t chunk;
  idx_t ndim, length, tiles;
  idx_t entry_begin, entry_end, nested;
  idx_t item_begin, item_end;
  int64_t out_offset;
  int64_t in_shared;    // norm slots in shared memory; else entry k's slot is the global partial below
  int64_t slot_first;   // partial index of (local entry 0, this chunk): base of the parameter + local chunk
  int64_t slot_stride;  // the parameter's chunk count (entry-major partials)
};

template <typename scalar_t, typename idx_t>
__global__ void __launch_bounds__(kThreads, Tuning<scalar_t>::kMinBlocks) aggregate_chunks_kernel(CudaArgs a) {
  // Entries in flight per warp, 16 loaded bytes per thread each (4 floats, or 4 doubles in two loads).
  constexpr int kUnroll = Tuning<scalar_t>::kUnroll;
  extern __shared__ double s_slots[];  // [shared_slots num | shared_slots den]
  __shared__ double s_acc[kWarps * kGpuTile];  // [warp][q][lane]: column c0 + 4 lane + q
  __shared__ double s_den[kWarps * kGpuTile];
  __shared__ double s_mean[kGpuTile];  // [q][lane]
  __shared__ idx_t s_row[2][kMaxDims - 1];  // global row coordinates of items with even / odd index
  __shared__ int64_t s_covered[kWarps];
  __shared__ ChunkContext<idx_t> ctx;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  for (;;) {
    if (threadIdx.x == 0) {
      const int64_t chunk = static_cast<int64_t>(atomicAdd(a.next_chunk, 1ull));
      ctx.chunk = chunk;
      if (chunk < a.num_chunks) {
        const int64_t* chunk_row = a.chunks + chunk * kChunkCols;
        const int64_t p = chunk_row[kChunkParam];
        const int64_t* param = a.params + p * kParamCols;
        const int64_t first_chunk = a.param_chunk_begin[p];
        ctx.param = param;
        ctx.ndim = static_cast<idx_t>(param[kParamNdim]);
        ctx.length = static_cast<idx_t>(row_length(param));
        ctx.tiles = static_cast<idx_t>(tiles_per_row(param, kGpuTile));
        ctx.entry_begin = static_cast<idx_t>(param[kParamEntryBegin]);
        ctx.entry_end = static_cast<idx_t>(param[kParamEntryEnd]);
        ctx.nested = param[kParamNested] != 0;
        ctx.item_begin = static_cast<idx_t>(chunk_row[kChunkItemBegin]);
        ctx.item_end = static_cast<idx_t>(chunk_row[kChunkItemEnd]);
        ctx.out_offset = param[kParamOutOffset];
        ctx.in_shared = ctx.entry_end - ctx.entry_begin <= a.shared_slots;
        ctx.slot_first = a.chunks[first_chunk * kChunkCols + kChunkPartialBase] + (chunk - first_chunk);
        ctx.slot_stride = a.param_chunk_begin[p + 1] - first_chunk;
      }
    }
    __syncthreads();
    if (ctx.chunk >= a.num_chunks) return;  // the same value for every thread: the whole block leaves

    // Norm slots of this chunk's entries start at 0.
    const int64_t num_entries = ctx.entry_end - ctx.entry_begin;
    for (int64_t k = threadIdx.x; k < num_entries; k += kThreads) {
      if (ctx.in_shared) {
        s_slots[k] = 0.0;
        s_slots[a.shared_slots + k] = 0.0;
      } else {
        a.partial_num[ctx.slot_first + k * ctx.slot_stride] = 0.0;
        a.partial_den[ctx.slot_first + k * ctx.slot_stride] = 0.0;
      }
    }
    // Thread kRowThread writes the row coordinates of the first item (and, while a mean is formed, the next's).
    if (threadIdx.x == kRowThread)
      row_coordinates(ctx.param, ctx.ndim, ctx.item_begin / ctx.tiles, s_row[ctx.item_begin & 1]);
    __syncthreads();

    int covered = 0;
    for (idx_t item = ctx.item_begin; item < ctx.item_end; ++item) {
      const idx_t length = ctx.length;
      const idx_t c0 = (item % ctx.tiles) * static_cast<idx_t>(kGpuTile);
      const idx_t c1 = lesser(c0 + static_cast<idx_t>(kGpuTile), length);
      const idx_t c = c0 + kColsPerLane * lane;
      // Written before the last barrier: at the chunk's start, or while the previous item's mean was formed.
      // The other buffer was last read in the previous item's pass 2, which every warp has left.
      const idx_t* g = s_row[item & 1];

      // Pass 1: this warp's entries, in order; kUnroll rows located and loaded before any is added.
      double acc[kColsPerLane], den[kColsPerLane];
#pragma unroll
      for (int q = 0; q < kColsPerLane; ++q) acc[q] = den[q] = 0.0;
      bool stop = false;  // nested: an entry missed the item, so every later one does too
      for (idx_t e0 = ctx.entry_begin + warp; e0 < ctx.entry_end && !stop; e0 += kWarps * kUnroll) {
        scalar_t v[kUnroll][kColsPerLane];
        unsigned mask[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const idx_t e = e0 + u * kWarps;
          mask[u] = 0;
          if (!stop && e < ctx.entry_end) {
            const scalar_t* x = entry_row<scalar_t>(a, ctx.param, ctx.ndim, g, e, length, c0, c1);
            if (x != nullptr)
              mask[u] = load_columns<scalar_t>(a, x, e, ctx.ndim, length, c, c1, v[u]);
            else if (ctx.nested)
              stop = true;
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (mask[u] == 0) continue;
          const double w = a.entry_weight[e0 + u * kWarps];
#pragma unroll
          for (int q = 0; q < kColsPerLane; ++q) {
            if (mask[u] & (1u << q)) {
              acc[q] += w * static_cast<double>(v[u][q]);
              den[q] += w;
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kColsPerLane; ++q) {
        s_acc[(warp * kColsPerLane + q) * kWarpSize + lane] = acc[q];
        s_den[(warp * kColsPerLane + q) * kWarpSize + lane] = den[q];
      }
      __syncthreads();

      // Mean over exactly the covering entries (warps added in order); 0 where none covers.
      if (threadIdx.x < kGpuTile) {
        const int j = threadIdx.x;  // column c0 + j, owned by lane j / 4 as its column j % 4
        const int slot = (j % kColsPerLane) * kWarpSize + j / kColsPerLane;
        double sum = 0.0, weight = 0.0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          sum += s_acc[w * kGpuTile + slot];
          weight += s_den[w * kGpuTile + slot];
        }
        const double mean = canonical_nan(weight > 0.0 ? sum / weight : 0.0);  // a NaN as the CPU writes it
        s_mean[slot] = mean;
        if (c0 + j < c1) {
          const int64_t row = static_cast<int64_t>(item / ctx.tiles);
          static_cast<scalar_t*>(a.out)[ctx.out_offset + row * ctx.length + c0 + j] = mean_out<scalar_t>(mean);
          covered += weight > 0.0 ? 1 : 0;
        }
      }
      if (threadIdx.x == kRowThread && item + 1 < ctx.item_end)
        row_coordinates(ctx.param, ctx.ndim, (item + 1) / ctx.tiles, s_row[(item + 1) & 1]);
      __syncthreads();

      // Pass 2: per entry, ||m_e (x_e - mean)||^2 and ||m_e mean||^2 over this item, into its slot.
      double mean[kColsPerLane];
#pragma unroll
      for (int q = 0; q < kColsPerLane; ++q) mean[q] = s_mean[q * kWarpSize + lane];
      stop = false;
      for (idx_t e0 = ctx.entry_begin + warp; e0 < ctx.entry_end && !stop; e0 += kWarps * kUnroll) {
        scalar_t v[kUnroll][kColsPerLane];
        unsigned mask[kUnroll];
        bool holds[kUnroll];  // the entry covers the item: the same for the whole warp
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const idx_t e = e0 + u * kWarps;
          mask[u] = 0;
          holds[u] = false;
          if (!stop && e < ctx.entry_end) {
            const scalar_t* x = entry_row<scalar_t>(a, ctx.param, ctx.ndim, g, e, length, c0, c1);
            if (x != nullptr) {
              holds[u] = true;
              mask[u] = load_columns<scalar_t>(a, x, e, ctx.ndim, length, c, c1, v[u]);
            } else if (ctx.nested) {
              stop = true;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (!holds[u]) continue;  // warp-uniform, so all 32 lanes reach the shuffles
          double sum_diff = 0.0, sum_mean = 0.0;
#pragma unroll
          for (int q = 0; q < kColsPerLane; ++q) {
            if (mask[u] & (1u << q)) {
              const double d = static_cast<double>(v[u][q]) - mean[q];
              sum_diff += d * d;
              sum_mean += mean[q] * mean[q];
            }
          }
          sum_diff = warp_sum(sum_diff);
          sum_mean = warp_sum(sum_mean);
          if (lane == 0) {
            const int64_t k = e0 + u * kWarps - ctx.entry_begin;  // k % kWarps == warp: this warp's slot alone
            if (ctx.in_shared) {
              s_slots[k] += sum_diff;
              s_slots[a.shared_slots + k] += sum_mean;
            } else {
              a.partial_num[ctx.slot_first + k * ctx.slot_stride] += sum_diff;
              a.partial_den[ctx.slot_first + k * ctx.slot_stride] += sum_mean;
            }
          }
        }
      }
    }

    // Covered count: integers, so the order does not matter.
    const int64_t warp_covered = warp_sum(static_cast<int64_t>(covered));
    if (lane == 0) s_covered[warp] = warp_covered;
    __syncthreads();  // also orders the last slot updates before the copy below
    if (threadIdx.x == 0) {
      int64_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += s_covered[w];
      a.chunk_covered[ctx.chunk] = total;
    }
    if (ctx.in_shared) {
      for (int64_t k = threadIdx.x; k < num_entries; k += kThreads) {
        a.partial_num[ctx.slot_first + k * ctx.slot_stride] = s_slots[k];
        a.partial_den[ctx.slot_first + k * ctx.slot_stride] = s_slots[a.shared_slots + k];
      }
    }
    __syncthreads();  // ctx, s_slots and s_covered are reused by the next chunk
  }
}

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

int64_t blocks_for(int64_t count, int64_t threads) { return max64(1, ceil_div(count, threads)); }

// Appends `count` int64 words to the host table and returns where they start.
int64_t append(std::vector<int64_t>& sizes, int64_t count) {
  int64_t start = 0;
  for (int64_t s : sizes) start += s;
  sizes.push_back(count);
  return start;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_into_cuda(const at::Tensor& out, at::TensorList packed,
                                                                   const at::Tensor& params,
                                                                   const at::Tensor& entries,
                                                                   const at::Tensor& weights) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  // 32-bit index arithmetic where every parameter (and so every packed tensor) and the entry count fit.
  bool index32 = !HASFL_CUDA_FORCE_INDEX64 && entries.size(0) < kIndex32Limit;
  {
    const int64_t* P = params.data_ptr<int64_t>();
    for (int64_t p = 0; p < params.size(0) && index32; ++p) {
      int64_t numel = 1;
      for (int d = 0; d < kMaxDims; ++d) numel *= P[p * kParamCols + kParamFull + d];
      index32 = numel < kIndex32Limit;
    }
  }
  const AggregatePlan plan = make_plan(params, entries, weights, kGpuTile, kGpuChunkElems);
  const int64_t num_params = params.size(0), num_entries = entries.size(0), num_clients = weights.size(0);
  const int64_t num_chunks = plan.chunks.size(0);
  const auto device = out.device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());

  // Every table the kernels read, in one pinned int64 buffer, copied to the device at once.
  std::vector<int64_t> sizes;
  const int64_t at_params = append(sizes, num_params * kParamCols);
  const int64_t at_entries = append(sizes, num_entries * kEntryCols);
  const int64_t at_chunks = append(sizes, num_chunks * kChunkCols);
  const int64_t at_chunk_begin = append(sizes, num_params + 1);
  const int64_t at_client_begin = append(sizes, num_clients + 1);
  const int64_t at_client_entries = append(sizes, num_entries);
  const int64_t at_data = append(sizes, num_entries);
  const int64_t at_vector_ok = append(sizes, num_entries);
  const int64_t at_weight = append(sizes, num_entries);  // float64 bit patterns
  const int64_t at_counter = append(sizes, 1);
  const int64_t table_words = append(sizes, 0);
  at::Tensor host = at::empty({table_words}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* h = host.data_ptr<int64_t>();
  const auto put = [&](int64_t at, const at::Tensor& t) {
    if (t.numel() > 0) std::memcpy(h + at, t.data_ptr(), t.numel() * sizeof(int64_t));
  };
  put(at_params, params);
  put(at_entries, entries);
  put(at_chunks, plan.chunks);
  put(at_chunk_begin, plan.param_chunk_begin);
  put(at_client_begin, plan.client_entry_begin);
  put(at_client_entries, plan.client_entries);
  put(at_weight, plan.entry_weight);  // same size as int64
  h[at_counter] = 0;
  const int64_t* P = params.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  const int64_t vector_elems = 16 / static_cast<int64_t>(out.element_size());
  for (int64_t e = 0; e < num_entries; ++e) {
    const int64_t* entry = E + e * kEntryCols;
    const int64_t last = P[entry[kEntryParam] * kParamCols + kParamNdim] - 1;
    const int64_t address = reinterpret_cast<int64_t>(packed[e].data_ptr());
    h[at_data + e] = address;
    // Rows start at local_row * width: 16-byte aligned for every row when the base is and width is a
    // multiple of the vector; and a window that does not wrap (offset 0) maps column c to local c.
    h[at_vector_ok + e] = address % 16 == 0 && entry[kEntryPacked + last] % vector_elems == 0 &&
                          entry[kEntryOffset + last] == 0;
  }
  at::Tensor tables = at::empty({table_words}, at::TensorOptions().dtype(at::kLong).device(device));
  tables.copy_(host, /*non_blocking=*/true);
  const int64_t* d = tables.data_ptr<int64_t>();

  // Partials, then per-entry sums; each written in full before it is read.
  at::Tensor sums = at::empty({2 * plan.num_partials + 2 * num_entries}, at::TensorOptions().dtype(at::kDouble).device(device));
  double* partial_num = sums.data_ptr<double>();
  double* partial_den = partial_num + plan.num_partials;
  double* entry_num = partial_den + plan.num_partials;
  double* entry_den = entry_num + num_entries;
  at::Tensor chunk_covered = at::empty({num_chunks}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor div_num = at::empty({num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor div_den = at::empty({num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));

  if (num_chunks > 0) {
    const int64_t shared_slots = min64(plan.max_entries, kMaxSharedSlots);
    const size_t shared_bytes = static_cast<size_t>(2 * shared_slots) * sizeof(double);  // <= 24 KiB: no opt-in
    int sm_count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device.index()));
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_into_cuda", [&] {
      CudaArgs args{d + at_params,
                    d + at_entries,
                    d + at_chunks,
                    d + at_chunk_begin,
                    d + at_data,
                    d + at_vector_ok,
                    reinterpret_cast<const double*>(d + at_weight),
                    out.data_ptr(),
                    partial_num,
                    partial_den,
                    chunk_covered.data_ptr<int64_t>(),
                    reinterpret_cast<unsigned long long*>(tables.data_ptr<int64_t>() + at_counter),
                    num_chunks,
                    shared_slots};
      const auto launch = [&](auto kernel) {
        int per_sm = 0;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared_bytes));
        const int64_t grid = min64(num_chunks, max64(1, static_cast<int64_t>(per_sm) * sm_count));
        kernel<<<static_cast<unsigned>(grid), kThreads, shared_bytes, stream>>>(args);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (index32)
        launch(aggregate_chunks_kernel<scalar_t, int32_t>);
      else
        launch(aggregate_chunks_kernel<scalar_t, int64_t>);
    });
  }
  if (num_entries > 0) {
    reduce_entries_kernel<<<static_cast<unsigned>(num_entries), kReduceThreads, 0, stream>>>(
        d + at_params, d + at_entries, d + at_chunks, d + at_chunk_begin, partial_num, partial_den, entry_num,
        entry_den);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (num_clients > 0) {
    reduce_clients_kernel<<<static_cast<unsigned>(blocks_for(num_clients, 256)), 256, 0, stream>>>(
        d + at_client_begin, d + at_client_entries, entry_num, entry_den, num_clients, div_num.data_ptr<double>(),
        div_den.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) { m.impl("aggregate_into", &aggregate_into_cuda); }

}  // namespace hasfl_ray
