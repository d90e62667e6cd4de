// Host-side checks and tables of hasfl_ray::aggregate_sparse_into: the fused aggregation of parameters whose
// clients hold per-dim index sets or unstructured masks (see cpu/aggregate_sparse_kernel.h), beside dense
// (slice/window) parameters in the same call.
//
// Extra arguments over aggregate_into:
//   kinds       int64 CPU (P): 0 = the parameter's entries are slices/windows (the dense kernel), 1 = sparse.
//   bits        one uint8 tensor per entry (sparse parameters: the column bitmask of the last canonical dim,
//               at least ceil(length / 8) bytes, on out's device; dense parameters: ignored).
//   rows        int64 CPU 1-D: the concatenated sorted index lists of the row dims of sparse entries.
//   row_offsets int64 CPU (E, kMaxDims): where entry e's index list of dim d (< ndim - 1) starts in rows;
//               its length is the entry's packed size in that dim.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "aggregate_layout.h"

namespace hasfl_ray {

struct SparsePrep {
  std::vector<int32_t> row_map;        // per sparse entry and row dim: full index -> local index or -1
  std::vector<int64_t> row_map_begin;  // (E, kMaxDims)
  std::vector<int64_t> tile_prefix;    // per sparse entry and tile of a row: set bits before the tile
  std::vector<int64_t> prefix_begin;   // (E)
};

// The sparse tables as the CPU kernels read them (prepare_sparse's, and each entry's bitmask).
struct SparseArgs {
  const uint8_t* const* bits;    // per entry: column bitmask of the last canonical dim
  const int32_t* row_map;        // concatenated maps full index -> local index or -1
  const int64_t* row_map_begin;  // (E, kMaxDims): start of entry e's map of dim d in row_map
  const int64_t* tile_prefix;    // per entry and tile of a row: packed elements of the row before the tile
  const int64_t* prefix_begin;   // (E): start of entry e's tile prefixes
  const uint8_t* runs = nullptr;  // per parameter or null (AVX-512 and AVX2 kernels): 1 when every 16-column word of
                                  // each of its entries' bitmasks sets a run of columns from the word's first
                                  // (run_words)
};

// True when every 16-column word (from column 0) of the bitmask m of a row of `length` columns sets a run of columns
// starting at the word's first (0, 1, 3, ..., 0xFFFF bits; bits past length count as clear).
inline bool run_words(const uint8_t* m, int64_t length) {
  int64_t j = 0;
  for (; j + 64 <= length; j += 64) {  // 64 columns at a time: a full mask's bitmask is scanned 8 bytes a step
    uint64_t quad;
    std::memcpy(&quad, m + j / 8, 8);
    if (quad == ~uint64_t{0}) continue;
    for (int t = 0; t < 4; ++t) {
      const unsigned bits = static_cast<unsigned>(quad >> (16 * t)) & 0xFFFFu;
      if (bits & (bits + 1u)) return false;
    }
  }
  for (; j < length; j += 16) {
    unsigned bits = m[j / 8];
    if (j + 8 < length) bits |= static_cast<unsigned>(m[j / 8 + 1]) << 8;
    if (length - j < 16) bits &= (1u << (length - j)) - 1u;
    if (bits & (bits + 1u)) return false;
  }
  return true;
}

// Index of row `row` (row-major over all dims but the last) inside sparse entry `e`'s packed rows, or -1 when
// one of its index lists misses the row (the sparse layouts' local_row).
inline int64_t sparse_local_row(const SparseArgs& sp, const int64_t* param, int64_t e, const int64_t* entry,
                                int64_t row) {
  return layout::mapped_local_row(sp.row_map, sp.row_map_begin, param, e, entry, row);
}

// Writes, for each tile of `tile` columns of a row of `length` columns, the set bits of bitmask m before it
// (prefix[t], t < ceil(length / tile)), and returns the row's total. One body, inlined into a build with the
// popcnt instruction and a portable one (without it, __builtin_popcountll is a library call per 8 bytes:
// the masks of 50 clients of EMNIST are 20 MB).
__attribute__((always_inline)) inline int64_t tile_prefix_body(const uint8_t* m, int64_t length, int64_t tile,
                                                               int64_t* prefix) {
  int64_t total = 0;
  for (int64_t t = 0; t * tile < length; ++t) {
    prefix[t] = total;
    const int64_t c0 = t * tile, c1 = layout::min64(c0 + tile, length);
    int64_t b = c0 / 8;
    for (; (b + 8) * 8 <= c1; b += 8) {
      uint64_t word;
      std::memcpy(&word, m + b, 8);
      total += __builtin_popcountll(word);
    }
    for (; b * 8 < c1; ++b) {
      unsigned byte = m[b];
      if (c1 - b * 8 < 8) byte &= (1u << (c1 - b * 8)) - 1u;
      total += __builtin_popcount(byte);
    }
  }
  return total;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__)
__attribute__((target("popcnt"))) inline int64_t tile_prefix_popcnt(const uint8_t* m, int64_t length, int64_t tile,
                                                                     int64_t* prefix) {
  return tile_prefix_body(m, length, tile, prefix);
}
inline int64_t fill_tile_prefix(const uint8_t* m, int64_t length, int64_t tile, int64_t* prefix) {
  static const bool popcnt = __builtin_cpu_supports("popcnt");
  return popcnt ? tile_prefix_popcnt(m, length, tile, prefix) : tile_prefix_body(m, length, tile, prefix);
}
#else
inline int64_t fill_tile_prefix(const uint8_t* m, int64_t length, int64_t tile, int64_t* prefix) {
  return tile_prefix_body(m, length, tile, prefix);
}
#endif

// Checks what the sparse kernel relies on for memory safety (Python validates first, with sentences) and
// builds the row maps and tile prefixes. `bits_host` are the bitmasks readable on the host.
inline SparsePrep prepare_sparse(const at::Tensor& params, const at::Tensor& entries, const at::Tensor& kinds,
                                 const std::vector<const uint8_t*>& bits_host, const std::vector<int64_t>& bits_len,
                                 const at::Tensor& rows, const at::Tensor& row_offsets, int64_t tile) {
  using namespace layout;
  const int64_t num_params = params.size(0), num_entries = entries.size(0);
  TORCH_CHECK(kinds.device().is_cpu() && kinds.scalar_type() == at::kLong && kinds.dim() == 1 &&
                  kinds.size(0) == num_params && kinds.is_contiguous(),
              "kinds must be a contiguous int64 CPU tensor of shape (", num_params, "), got ", kinds.sizes());
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(),
              "rows must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK(row_offsets.device().is_cpu() && row_offsets.scalar_type() == at::kLong && row_offsets.dim() == 2 &&
                  row_offsets.size(0) == num_entries && row_offsets.size(1) == kMaxDims && row_offsets.is_contiguous(),
              "row_offsets must be a contiguous int64 CPU tensor of shape (", num_entries, ", ", kMaxDims, ")");
  TORCH_CHECK(static_cast<int64_t>(bits_host.size()) == num_entries, "bits has ", bits_host.size(),
              " tensors but entries has ", num_entries, " rows");
  const int64_t* P = params.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* R = rows.data_ptr<int64_t>();
  const int64_t* O = row_offsets.data_ptr<int64_t>();
  const int64_t num_rows_total = rows.size(0);
  SparsePrep prep;
  std::vector<int64_t> sparse_entries, sparse_params;  // the entries of sparse parameters, in order, and theirs
  prep.row_map_begin.assign(num_entries * kMaxDims, 0);
  prep.prefix_begin.assign(num_entries, 0);
  for (int64_t p = 0; p < num_params; ++p) {
    TORCH_CHECK(K[p] == 0 || K[p] == 1, "kinds[", p, "] is ", K[p], "; expected 0 (dense) or 1 (sparse)");
    if (K[p] == 0) continue;
    const int64_t* param = P + p * kParamCols;
    TORCH_CHECK(!param[kParamNested], "params[", p, "] is sparse and cannot be marked nested");
    const int64_t ndim = param[kParamNdim], length = row_length(param);
    const int64_t tiles = ceil_div(length, tile);
    for (int64_t e = param[kParamEntryBegin]; e < param[kParamEntryEnd]; ++e) {
      const int64_t* entry = E + e * kEntryCols;
      for (int64_t d = 0; d + 1 < ndim; ++d) {
        const int64_t full = param[kParamFull + d], count = entry[kEntryPacked + d], start = O[e * kMaxDims + d];
        TORCH_CHECK(start >= 0 && start + count <= num_rows_total, "row_offsets[", e, "][", d, "] reads past rows");
        TORCH_CHECK(entry[kEntryOffset + d] == 0, "entries[", e, "] is sparse and cannot have a rolling offset");
        prep.row_map_begin[e * kMaxDims + d] = static_cast<int64_t>(prep.row_map.size());
        prep.row_map.resize(prep.row_map.size() + full, -1);
        int32_t* map = prep.row_map.data() + prep.row_map_begin[e * kMaxDims + d];
        int64_t previous = -1;
        for (int64_t i = 0; i < count; ++i) {
          const int64_t index = R[start + i];
          TORCH_CHECK(index > previous && index < full, "entries[", e, "] has index ", index, " at position ", i,
                      " of dim ", d, "; expected strictly increasing indices in [0, ", full, ")");
          map[index] = static_cast<int32_t>(i);
          previous = index;
        }
      }
      TORCH_CHECK(entry[kEntryOffset + ndim - 1] == 0, "entries[", e, "] is sparse and cannot have a rolling offset");
      TORCH_CHECK(bits_len[e] >= ceil_div(length, 8), "bits[", e, "] has ", bits_len[e], " bytes; expected at least ",
                  ceil_div(length, 8));
      prep.prefix_begin[e] = static_cast<int64_t>(prep.tile_prefix.size());
      prep.tile_prefix.resize(prep.tile_prefix.size() + tiles);
      sparse_entries.push_back(e);
      sparse_params.push_back(p);
    }
  }
  // The bitmasks' prefixes, entries in parallel (no throw inside the parallel loop: the totals are checked after).
  const int64_t count = static_cast<int64_t>(sparse_entries.size());
  std::vector<int64_t> totals(count);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = sparse_entries[i];
    const int64_t* param = P + sparse_params[i] * kParamCols;
    totals[i] = fill_tile_prefix(bits_host[e], row_length(param), tile, prep.tile_prefix.data() + prep.prefix_begin[e]);
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = sparse_entries[i];
    const int64_t held = E[e * kEntryCols + kEntryPacked + P[sparse_params[i] * kParamCols + kParamNdim] - 1];
    TORCH_CHECK(totals[i] == held, "bits[", e, "] sets ", totals[i], " bits of the last dim but entries[", e,
                "] holds ", held);
  }
  return prep;
}

}  // namespace hasfl_ray
