// Layout descriptor of the fused aggregation and the index arithmetic shared by the CPU and CUDA kernels.
//
// The descriptor is built in Python (hasfl_ray/ops/aggregate.py) as two int64 tables:
//
//   params  (P, kParamCols)  one row per parameter, in output order. Its canonical full shape has `ndim`
//                            (1..kMaxDims) dims: gate blocks become an extra leading dim, trailing dims that
//                            every client holds in full are merged into the dim before them. The output is
//                            the row-major flat buffer of that shape at `out_offset`.
//   entries (E, kEntryCols)  one row per (parameter, client holding it), grouped by parameter
//                            [entry_begin, entry_end) and, inside a parameter, sorted by packed size
//                            descending (ties by client id). Per canonical dim: the packed size and the
//                            rolling offset (0 unless the client's window wraps, FedRolex-style).
//
// Client `e` holds global index g of dim d at local index (g - offset[d]) mod full[d], when that is
// < packed[d]. With offset 0 this is the leading slice. When the parameter is `nested` (every entry's
// window contains the next one's: equal offsets, packed sizes non-increasing), the clients covering any
// coordinate are a prefix of the entry list, so loops over entries stop at the first that misses.
//
// Work is split into chunks that depend only on the shapes (never on the thread count): a parameter's
// rows (all dims but the last) times tiles of its last dim form its items; a chunk is a run of items of
// one parameter. Each chunk writes its own per-entry norm partials; partials are then summed in a fixed
// order (chunks in order per entry, then a client's entries in parameter order), so results are
// bit-identical from run to run. A parameter's partials fill [base of its first chunk, + chunks x entries):
// the CPU kernel stores them chunk-major (kChunkPartialBase + local entry, summed by reduce_entry), the
// CUDA kernel entry-major (local entry x chunks + local chunk, so one block reads an entry's run at once).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HASFL_HD __host__ __device__ __forceinline__
#else
#define HASFL_HD inline
#endif

namespace hasfl_ray {
namespace layout {

constexpr int kMaxDims = 6;

// Columns of the params table.
constexpr int kParamNdim = 0;
constexpr int kParamFull = 1;  // kMaxDims columns, unused ones are 1
constexpr int kParamOutOffset = kParamFull + kMaxDims;
constexpr int kParamEntryBegin = kParamOutOffset + 1;
constexpr int kParamEntryEnd = kParamEntryBegin + 1;
constexpr int kParamNested = kParamEntryEnd + 1;
constexpr int kParamCols = kParamNested + 1;

// Columns of the entries table.
constexpr int kEntryClient = 0;
constexpr int kEntryParam = 1;
constexpr int kEntryPacked = 2;  // kMaxDims columns, unused ones are 1
constexpr int kEntryOffset = kEntryPacked + kMaxDims;  // kMaxDims columns, unused ones are 0
constexpr int kEntryCols = kEntryOffset + kMaxDims;

// Columns of the chunk table (built on the host from the params table, see make_chunks).
constexpr int kChunkParam = 0;
constexpr int kChunkItemBegin = 1;
constexpr int kChunkItemEnd = 2;
constexpr int kChunkPartialBase = 3;  // this chunk's partials are [base, base + entries of its param)
constexpr int kChunkCols = 4;

HASFL_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
HASFL_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
HASFL_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

HASFL_HD int64_t param_ndim(const int64_t* param) { return param[kParamNdim]; }
HASFL_HD int64_t row_length(const int64_t* param) { return param[kParamFull + param[kParamNdim] - 1]; }

HASFL_HD int64_t num_rows(const int64_t* param) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < param[kParamNdim]; ++d) rows *= param[kParamFull + d];
  return rows;
}

// Items of a parameter: rows x tiles of at most `tile` columns of the last dim.
HASFL_HD int64_t tiles_per_row(const int64_t* param, int64_t tile) { return ceil_div(row_length(param), tile); }
HASFL_HD int64_t num_items(const int64_t* param, int64_t tile) {
  int64_t length = row_length(param);
  return length == 0 ? 0 : num_rows(param) * tiles_per_row(param, tile);
}

// Items per chunk so that a chunk spans about `chunk_elems` coordinates.
HASFL_HD int64_t items_per_chunk(const int64_t* param, int64_t tile, int64_t chunk_elems) {
  int64_t width = min64(row_length(param), tile);
  return max64(1, chunk_elems / max64(width, 1));
}

// The sparse layouts' local_row: index of row `row` (row-major over all dims but the last) inside sparse entry
// `e`'s packed rows, or -1 when one of its index lists misses the row. `row_map` concatenates the entries' maps
// (full index -> local index or -1), `row_map_begin` (E, kMaxDims) says where entry e's map of dim d starts. The
// CPU kernels (aggregate_sparse_host.h) and the CUDA kernel (aggregate_sparse_cuda.cu) both call this one.
HASFL_HD int64_t mapped_local_row(const int32_t* row_map, const int64_t* row_map_begin, const int64_t* param,
                                  int64_t e, const int64_t* entry, int64_t row) {
  const int64_t ndim = param[kParamNdim];
  int64_t local = 0, stride = 1;
  for (int64_t d = ndim - 2; d >= 0; --d) {
    const int64_t full = param[kParamFull + d];
    const int32_t index = row_map[row_map_begin[e * kMaxDims + d] + row % full];
    row /= full;
    if (index < 0) return -1;
    local += index * stride;
    stride *= entry[kEntryPacked + d];
  }
  return local;
}

// Index of row `row` (row-major over all dims but the last) inside entry `entry`'s packed tensor, or -1
// when the entry does not cover that row. The packed row starts at local_row * packed[last].
HASFL_HD int64_t local_row(const int64_t* param, const int64_t* entry, int64_t row) {
  const int64_t ndim = param[kParamNdim];
  int64_t local = 0;
  int64_t stride = 1;
  for (int64_t d = ndim - 2; d >= 0; --d) {
    const int64_t full = param[kParamFull + d];
    const int64_t global = row % full;
    row /= full;
    int64_t index = global - entry[kEntryOffset + d];
    if (index < 0) index += full;
    const int64_t packed = entry[kEntryPacked + d];
    if (index >= packed) return -1;
    local += index * stride;
    stride *= packed;
  }
  return local;
}

// Local index of global column `column` of the last dim inside an entry's window, or -1 outside it.
HASFL_HD int64_t local_column(int64_t column, int64_t offset, int64_t width, int64_t length) {
  int64_t index = column - offset;
  if (index < 0) index += length;
  return index < width ? index : -1;
}

// A run of columns [begin, end) of a tile covered by one entry, starting at local column `local`.
struct Piece {
  int64_t begin;
  int64_t end;
  int64_t local;
};

// The (at most 2) runs where the window {offset, ..., offset + width - 1} mod length meets [c0, c1).
// Equivalent to testing local_column on every column, in order of increasing column.
HASFL_HD int window_pieces(int64_t offset, int64_t width, int64_t length, int64_t c0, int64_t c1, Piece* pieces) {
  int count = 0;
  // The wrapped part of the window, columns [0, offset + width - length), comes first in column order.
  const int64_t wrapped_end = offset + width - length;
  if (wrapped_end > 0) {
    const int64_t lo = max64(0, c0), hi = min64(wrapped_end, c1);
    if (lo < hi) pieces[count++] = Piece{lo, hi, lo + length - offset};
  }
  const int64_t lo = max64(offset, c0), hi = min64(min64(offset + width, length), c1);
  if (lo < hi) pieces[count++] = Piece{lo, hi, lo - offset};
  return count;
}

// Whether the window {offset, ..., offset + width - 1} mod length meets [c0, c1): window_pieces(...) > 0
// without the pieces (the CUDA kernel's per-entry test of a tile).
HASFL_HD bool window_meets(int64_t offset, int64_t width, int64_t length, int64_t c0, int64_t c1) {
  const int64_t wrapped_end = offset + width - length;
  if (wrapped_end > 0 && max64(0, c0) < min64(wrapped_end, c1)) return true;
  return max64(offset, c0) < min64(min64(offset + width, length), c1);
}

// One chunk of the work split, unpacked: what every CPU kernel's chunk loop starts from (the dense, the sparse and
// the private one). Items are (row, tile of `tile` columns of the last dim); a chunk's norm partials are
// [partial_base, + entries of its parameter), one per entry in order. Host code only (the CUDA kernel splits its
// work by blocks).
struct ChunkView {
  const int64_t* param;
  int64_t p, ndim, length, tiles, tile;
  int64_t entry_begin, entry_end, item_begin, item_end, partial_base, out_offset;

  inline ChunkView(const int64_t* params, const int64_t* chunks, int64_t chunk, int64_t tile_columns) {
    const int64_t* chunk_row = chunks + chunk * kChunkCols;
    p = chunk_row[kChunkParam];
    param = params + p * kParamCols;
    ndim = param[kParamNdim];
    length = row_length(param);
    tile = tile_columns;
    tiles = tiles_per_row(param, tile);
    entry_begin = param[kParamEntryBegin];
    entry_end = param[kParamEntryEnd];
    item_begin = chunk_row[kChunkItemBegin];
    item_end = chunk_row[kChunkItemEnd];
    partial_base = chunk_row[kChunkPartialBase];
    out_offset = param[kParamOutOffset];
  }

  inline int64_t row_of(int64_t item) const { return item / tiles; }
  inline int64_t tile_of(int64_t item) const { return item % tiles; }
  inline int64_t first_column(int64_t item) const { return tile_of(item) * tile; }
  inline int64_t end_column(int64_t item) const { return min64(first_column(item) + tile, length); }
  // The parameter's output (its flat buffer inside the call's) and this chunk's partials.
  template <typename scalar_t>
  inline scalar_t* output(void* out) const { return static_cast<scalar_t*>(out) + out_offset; }
  inline double* partials(double* partial) const { return partial + partial_base; }

  // The entries covering row `row`, in entry order: row_entry[k] = e and row_start[k] = the row's first element
  // inside e's packed tensor (local row x packed size of the last dim). local_of(e, entry, row) is the entry's
  // local row or -1 where it misses the row; kStopAtMiss: stop at the first miss (nested windows: the covering
  // entries are a prefix). Returns how many.
  template <bool kStopAtMiss, typename LocalOf>
  inline int64_t collect_row(const int64_t* entries, int64_t row, int64_t* row_entry, int64_t* row_start,
                             LocalOf&& local_of) const {
    int64_t count = 0;
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t* entry = entries + e * kEntryCols;
      const int64_t local = local_of(e, entry, row);
      if (local < 0) {
        if (kStopAtMiss) break;
        continue;
      }
      row_entry[count] = e;
      row_start[count] = local * entry[kEntryPacked + ndim - 1];
      ++count;
    }
    return count;
  }

  // collect_row of the dense layouts (slices, windows, gate blocks): local_row.
  template <bool kStopAtMiss>
  inline int64_t collect_dense_row(const int64_t* entries, int64_t row, int64_t* row_entry, int64_t* row_start) const {
    const int64_t* of = param;
    return collect_row<kStopAtMiss>(entries, row, row_entry, row_start,
                                    [of](int64_t, const int64_t* entry, int64_t r) { return local_row(of, entry, r); });
  }
};

// Sum of the chunk partials of entry `entry` (chunks of its parameter, in order).
HASFL_HD double reduce_entry(const int64_t* params, const int64_t* entries, const int64_t* chunks,
                             const int64_t* param_chunk_begin, const double* partial, int64_t entry) {
  const int64_t p = entries[entry * kEntryCols + kEntryParam];
  const int64_t local = entry - params[p * kParamCols + kParamEntryBegin];
  double total = 0.0;
  for (int64_t c = param_chunk_begin[p]; c < param_chunk_begin[p + 1]; ++c)
    total += partial[chunks[c * kChunkCols + kChunkPartialBase] + local];
  return total;
}

}  // namespace layout
}  // namespace hasfl_ray
