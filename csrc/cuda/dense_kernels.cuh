// The dense CUDA op's chunk kernel (aggregate_cuda.cu runs it; tests/aggregation/cuda_emulation/ runs the same source
// on the CPU, a block's threads as fibers); its reductions are in dense_reduce.cuh. See aggregate_cuda.cu for the
// mapping.
#pragma once

#include <cstdint>

#include "aggregate_layout.h"
#include "cuda/canonical_nan.cuh"
#include "cuda/dense_common.cuh"

// Dynamic shared memory: a CUDA extern array; the CPU emulation defines its own (emulate_cuda.h).
#ifndef HASFL_DYNAMIC_SHARED
#define HASFL_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace hasfl_ray {
namespace {

using namespace layout;

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
  HASFL_DYNAMIC_SHARED(double, s_slots);  // [shared_slots num | shared_slots den]
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

}  // namespace
}  // namespace hasfl_ray
