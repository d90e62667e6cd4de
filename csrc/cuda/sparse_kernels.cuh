// The sparse CUDA op's kernels (aggregate_sparse_cuda.cu runs them; tests/aggregation/cuda_emulation/ runs the same
// source on the CPU, a block's threads as host threads): parameters whose clients hold index sets or masks (kind 1,
// see csrc/aggregate_sparse_host.h) beside slices and windows (kind 0), gathered in one pass.
//
// Mapping (both kernels): one block of 128 threads per chunk (a run of items of one parameter); an item is one row
// and a tile of <= 128 columns of its last dim, thread j owning column c0 + j. Whether an entry holds the row is
// uniform over the block (kind 1: the row map of every row dim; kind 0: local_row). Kind 1: the thread's bit of the
// tile's 16 bitmask bytes and its rank among the tile's set bits (popcount of the bits below it) give the value's
// place, row start + tile prefix + rank, in the packed tensor. Kind 0: local_column.
//   pass 1: acc = fma(w, x, acc) and den += w over the holding entries, in entry order; mean = acc / den (0 where no
//           entry holds the column; a NaN as kCanonicalNan, as the CPU builds write it), written to out.
//   pass 2: per holding entry, (x - mean)^2 and mean^2 over the held columns, a warp sum (fixed xor-shuffle tree)
//           added by lane 0 to the slot of (chunk, entry, warp) in item order: one writer per slot, no atomics.
//   then:   sparse_reduce_kernel (sparse_access.cuh) sums each client's slots in a fixed order.
// The two kernels do the same adds in the same order (their results are equal bit for bit, NaN-free or not, up to
// a NaN's payload in the norms):
//   sparse_serial_kernel: the first one (a card measured it: 0.5-1.1 % of the H200's copy). Each thread walks the
//           entries one after the other, and each step waits on 4 dependent global loads (row map, bitmask, tile
//           prefix, value) and lane 0's read-modify-write of its slot.
//   sparse_tabled_kernel: per item, the block first describes up to 128 entries at once, a thread each (where it
//           holds the row and the tile, its bitmask words, its data and weight), in shared memory; the walk then
//           reads that table and issues kUnroll entries' value loads before their fmas, and pass 2's slots of the
//           first kSlotEntries entries are summed in shared memory and written once per chunk.
#pragma once

#include <cstdint>

#include "aggregate_layout.h"
#include "cuda/canonical_nan.cuh"
#include "cuda/sparse_access.cuh"

namespace hasfl_ray {
namespace {

using namespace layout;

struct SparseCudaArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const int64_t* kinds;          // per parameter
  const int64_t* data;           // per entry: address of its packed tensor
  const double* entry_weight;    // per entry
  const int64_t* bits_at;        // per entry: start of its bitmask in bits (kind 1)
  const int64_t* row_map_begin;  // (E, kMaxDims)
  const int64_t* prefix_begin;   // (E)
  const int64_t* tile_prefix;
  const int32_t* row_map;
  const uint8_t* bits;
  void* out;
  double* partial_num;  // (num_partials, kSparseWarps): [(chunk partial base + local entry) * warps + warp]
  double* partial_den;
  int64_t* chunk_covered;
};

// The arguments over a table buffer `d` laid out as `t` says (sparse_tables.h's TableOffsets); host code.
template <typename Offsets>
inline SparseCudaArgs sparse_args(const int64_t* d, const Offsets& t, void* out, double* sums, int64_t slots,
                                  int64_t* chunk_covered) {
  return SparseCudaArgs{d + t.params,
                        d + t.entries,
                        d + t.chunks,
                        d + t.kinds,
                        d + t.data,
                        reinterpret_cast<const double*>(d + t.weight),
                        d + t.bits_at,
                        d + t.map_begin,
                        d + t.prefix_begin,
                        d + t.prefix,
                        reinterpret_cast<const int32_t*>(d + t.row_map),
                        reinterpret_cast<const uint8_t*>(d + t.bits),
                        out,
                        sums,
                        sums + slots,
                        chunk_covered};
}

// The chunk's covered columns: the block's per-thread counts summed by thread 0 in thread order.
__device__ __forceinline__ void write_covered(long long* counts, long long covered, int64_t chunk, int64_t* out) {
  const int j = threadIdx.x;
  counts[j] = covered;
  __syncthreads();
  if (j == 0) {
    long long total = 0;
    for (int t = 0; t < kSparseThreads; ++t) total += counts[t];
    out[chunk] = total;
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSparseThreads) sparse_serial_kernel(SparseCudaArgs a) {
  __shared__ long long counts[kSparseThreads];
  const int64_t chunk = blockIdx.x;
  const int j = threadIdx.x, warp = j / 32, lane = j % 32;
  const int64_t* chunk_row = a.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = a.params + p * kParamCols;
  const bool sparse = a.kinds[p] != 0;
  const int64_t length = row_length(param);
  const int64_t tiles = ceil_div(length, kSparseTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  const int64_t base = chunk_row[kChunkPartialBase];
  scalar_t* out = static_cast<scalar_t*>(a.out) + param[kParamOutOffset];
  long long covered = 0;
  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles, tile = item % tiles, c0 = tile * kSparseTile;
    const bool active = j < length - c0;
    double acc = 0.0, den = 0.0;
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0 || !active) continue;
      const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
      if (at < 0) continue;
      const double w = a.entry_weight[e];
      acc = fma(w, static_cast<double>(reinterpret_cast<const scalar_t*>(a.data[e])[at]), acc);
      den += w;
    }
    const double mean = canonical_nan(den > 0.0 ? acc / den : 0.0);
    if (active) {
      out[row * length + c0 + j] = mean_out<scalar_t>(mean);
      covered += den > 0.0 ? 1 : 0;
    }
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0) continue;  // uniform over the block: every lane reaches the shuffles below
      double diff = 0.0, square = 0.0;
      if (active) {
        const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
        if (at >= 0) {
          const double d = static_cast<double>(reinterpret_cast<const scalar_t*>(a.data[e])[at]) - mean;
          diff = d * d;
          square = mean * mean;
        }
      }
      diff = sparse_warp_sum(diff);
      square = sparse_warp_sum(square);
      if (lane == 0) {
        const int64_t slot = (base + e - entry_begin) * kSparseWarps + warp;
        a.partial_num[slot] += diff;
        a.partial_den[slot] += square;
      }
    }
  }
  write_covered(counts, covered, chunk, a.chunk_covered);
}

constexpr int kTableEntries = kSparseThreads;  // entries described at once: a thread each
constexpr int kSlotEntries = 256;              // entries whose slots a block sums in shared memory
constexpr int kUnroll = 4;                     // entries whose value loads are issued before their fmas

// Per entry of the current batch (shared memory): `at` is where the item's row (kind 0) or tile (kind 1) starts in
// its packed tensor, -1 where the entry holds nothing there (uniform over the block); kind 1: lo, hi are the tile's
// bitmask words; kind 0: lo, hi are the entry's window offset and width of the last dim.
struct EntryTable {
  const void* data[kTableEntries];
  long long at[kTableEntries];
  unsigned long long lo[kTableEntries];
  unsigned long long hi[kTableEntries];
  double weight[kTableEntries];
};

// Thread j describes local entry k0 + j (< count) of the item (row, tile) in `table`.
__device__ __forceinline__ void describe_entries(const SparseCudaArgs& a, const int64_t* param, bool sparse,
                                                 int64_t entry_begin, int64_t k0, int64_t count, int64_t row,
                                                 int64_t tile, EntryTable* table) {
  const int j = threadIdx.x;
  if (j >= count) return;
  const int64_t e = entry_begin + k0 + j;
  const int64_t* entry = a.entries + e * kEntryCols;
  const int64_t ndim = param[kParamNdim];
  const int64_t start = sparse_row_start(a, param, sparse, e, row);
  long long at = start;
  unsigned long long lo, hi;
  if (sparse) {
    const uint64_t* m = reinterpret_cast<const uint64_t*>(a.bits + a.bits_at[e] + tile * (kSparseTile / 8));
    lo = m[0];
    hi = m[1];
    if (start >= 0) at = (lo | hi) ? start + a.tile_prefix[a.prefix_begin[e] + tile] : -1;
  } else {
    lo = static_cast<unsigned long long>(entry[kEntryOffset + ndim - 1]);
    hi = static_cast<unsigned long long>(entry[kEntryPacked + ndim - 1]);
  }
  table->data[j] = reinterpret_cast<const void*>(a.data[e]);
  table->at[j] = at;
  table->lo[j] = lo;
  table->hi[j] = hi;
  table->weight[j] = a.entry_weight[e];
}

// Where thread j's column lies in entry k's packed tensor (its table row), or -1 where the entry does not hold it.
template <bool kSparse>
__device__ __forceinline__ long long table_element(const EntryTable* table, int k, int j, int64_t c0,
                                                   int64_t length) {
  const long long at = table->at[k];
  if (at < 0) return -1;
  if (kSparse) {
    const int below = tile_rank(table->lo[k], table->hi[k], j);
    return below < 0 ? -1 : at + below;
  }
  const int64_t column = local_column(c0 + j, static_cast<int64_t>(table->lo[k]), static_cast<int64_t>(table->hi[k]),
                                      length);
  return column < 0 ? -1 : at + column;
}

template <typename scalar_t, bool kSparse>
__device__ __forceinline__ void tabled_chunk(const SparseCudaArgs& a, EntryTable* table, double* slot_num,
                                             double* slot_den, long long* counts) {
  const int64_t chunk = blockIdx.x;
  const int j = threadIdx.x, warp = j / 32, lane = j % 32;
  const int64_t* chunk_row = a.chunks + chunk * kChunkCols;
  const int64_t* param = a.params + chunk_row[kChunkParam] * kParamCols;
  const int64_t length = row_length(param);
  const int64_t tiles = ceil_div(length, kSparseTile);
  const int64_t entry_begin = param[kParamEntryBegin], entries = param[kParamEntryEnd] - entry_begin;
  const int64_t base = chunk_row[kChunkPartialBase];
  const int64_t shared_slots = min64(entries, kSlotEntries) * kSparseWarps;
  const int64_t batches = ceil_div(entries, kTableEntries);
  scalar_t* out = static_cast<scalar_t*>(a.out) + param[kParamOutOffset];
  for (int64_t s = j; s < shared_slots; s += kSparseThreads) slot_num[s] = slot_den[s] = 0.0;
  long long covered = 0;
  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles, tile = item % tiles, c0 = tile * kSparseTile;
    const bool active = j < length - c0;
    double acc = 0.0, den = 0.0;
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t k0 = b * kTableEntries, count = min64(entries - k0, kTableEntries);
      __syncthreads();  // the table's last readers are done
      describe_entries(a, param, kSparse, entry_begin, k0, count, row, tile, table);
      __syncthreads();
      if (!active) continue;
      for (int k = 0; k < count; k += kUnroll) {
        long long at[kUnroll];
        double x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) at[u] = k + u < count ? table_element<kSparse>(table, k + u, j, c0, length) : -1;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          x[u] = at[u] >= 0 ? static_cast<double>(static_cast<const scalar_t*>(table->data[k + u])[at[u]]) : 0.0;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (at[u] < 0) continue;
          const double w = table->weight[k + u];
          acc = fma(w, x[u], acc);
          den += w;
        }
      }
    }
    const double mean = canonical_nan(den > 0.0 ? acc / den : 0.0);
    if (active) {
      out[row * length + c0 + j] = mean_out<scalar_t>(mean);
      covered += den > 0.0 ? 1 : 0;
    }
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t k0 = b * kTableEntries, count = min64(entries - k0, kTableEntries);
      if (batches > 1) {  // else the table still describes this item
        __syncthreads();
        describe_entries(a, param, kSparse, entry_begin, k0, count, row, tile, table);
        __syncthreads();
      }
      for (int k = 0; k < count; k += kUnroll) {
        double diff[kUnroll], square[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          diff[u] = square[u] = 0.0;
          if (k + u >= count || !active) continue;
          const long long at = table_element<kSparse>(table, k + u, j, c0, length);
          if (at < 0) continue;
          const double d = static_cast<double>(static_cast<const scalar_t*>(table->data[k + u])[at]) - mean;
          diff[u] = d * d;
          square[u] = mean * mean;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          // table->at is uniform over the block: every lane takes the same branch to the shuffles.
          if (k + u >= count || table->at[k + u] < 0) continue;
          diff[u] = sparse_warp_sum(diff[u]);
          square[u] = sparse_warp_sum(square[u]);
          if (lane != 0) continue;
          const int64_t local = k0 + k + u;
          if (local < kSlotEntries) {
            slot_num[local * kSparseWarps + warp] += diff[u];
            slot_den[local * kSparseWarps + warp] += square[u];
          } else {
            a.partial_num[(base + local) * kSparseWarps + warp] += diff[u];
            a.partial_den[(base + local) * kSparseWarps + warp] += square[u];
          }
        }
      }
    }
  }
  __syncthreads();
  for (int64_t s = j; s < shared_slots; s += kSparseThreads) {
    a.partial_num[base * kSparseWarps + s] = slot_num[s];
    a.partial_den[base * kSparseWarps + s] = slot_den[s];
  }
  write_covered(counts, covered, chunk, a.chunk_covered);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSparseThreads) sparse_tabled_kernel(SparseCudaArgs a) {
  __shared__ EntryTable table;
  __shared__ double slot_num[kSlotEntries * kSparseWarps];
  __shared__ double slot_den[kSlotEntries * kSparseWarps];
  __shared__ long long counts[kSparseThreads];
  if (a.kinds[a.chunks[blockIdx.x * kChunkCols + kChunkParam]] != 0)
    tabled_chunk<scalar_t, true>(a, &table, slot_num, slot_den, counts);
  else
    tabled_chunk<scalar_t, false>(a, &table, slot_num, slot_den, counts);
}

}  // namespace
}  // namespace hasfl_ray
