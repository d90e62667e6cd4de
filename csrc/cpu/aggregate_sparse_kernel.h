// The per-chunk CPU kernel of the fused aggregation for index-set and mask parameters. No include guard on
// purpose: aggregate_cpu.cpp includes it three times, inside namespaces `avx512`, `avx2sparse` and `generic`, with
// HASFL_SPARSE_AVX512 / HASFL_SPARSE_AVX2 set to 1 / 0 (AVX-512 target attribute), 0 / 1 (AVX2, no FMA) or 0 / 0
// (portable). It must include nothing itself.
//
// A sparse entry holds, of its parameter's canonical shape (rows x length), the rows whose every row dim
// index is in the entry's sorted index list of that dim (row_map: full index -> local index or -1), and in
// each such row the columns whose bit is set in the entry's column bitmask (little bit order, bit c of byte
// c / 8 is column c). Its packed tensor is row-major over exactly those coordinates, so the packed run of a
// tile starts at local_row * packed_last + (set bits before the tile), `tile_prefix`. A mask is the case of
// one row (the canonical shape is the flat tensor); a per-layer channel index set keeps the conv/linear
// dims, with the column bitmask spelling out its last (merged) dim.
//
// Per item (one row, one tile of <= kCpuTile columns): pass 1 expands each covering entry's packed run
// into the tile (acc = w x + acc, den += w over its set bits; entries in order), the mean is acc / den (0 where
// den is 0), pass 2 computes sum (x - mean)^2 and sum mean^2 over the entry's set bits. This file's kernel is the
// portable build: bit by bit, one entry at a time, expanding again in pass 2; its AVX2 build (namespace avx2sparse,
// HASFL_SPARSE_AVX2) the same arithmetic, float32 16 columns a step over every covering entry with the sums in
// registers (aggregate_sparse_avx2_pull.h), float64 4 columns at a time where an entry's bits fill its nibbles
// enough, bit by bit elsewhere (aggregate_sparse_avx2.h). The AVX-512
// build (aggregate_sparse_pull.h) takes 64 columns at a time, the sums in registers, fused multiply-adds. Norm
// partials are 16 lanes (column mod 16) combined in a fixed tree per tile, in every build.

// SparseScratch is defined in aggregate_cpu.cpp and SparseArgs in aggregate_sparse_host.h, outside the two
// namespaces; clear_tile_sums, write_tile_mean and write_tile_zeros (shared with the dense kernel) in
// aggregate_tile.h, included before this file; ChunkView (the chunk's preamble and row collection) in
// aggregate_layout.h.


// The bits of columns [j, j + 16) of a tile of n columns (j a multiple of 16; bits past n cleared).
HASFL_SPARSE_TARGET inline unsigned bits16(const uint8_t* m, int64_t j, int64_t n) {
  unsigned bits = m[j / 8];
  if (j + 8 < n) bits |= static_cast<unsigned>(m[j / 8 + 1]) << 8;
  if (n - j < 16) bits &= (1u << (n - j)) - 1u;
  return bits;
}

// The 64 bits of columns [j, j + 64) of a tile of n columns whose bitmask starts at m (j a multiple of 64; bits past
// n cleared; the bytes read are those bits16 reads for the same four words). The AVX-512 build's pass and the AVX2
// build's pass 2 of an entry holding few columns (push_tile_squares) read their bits 64 at a time with it.
HASFL_SPARSE_TARGET inline uint64_t bits64(const uint8_t* m, int64_t j, int64_t n) {
  uint64_t quad = 0;
  if (n - j >= 64) {
    std::memcpy(&quad, m + j / 8, 8);
    return quad;
  }
  for (int64_t b = 0; b * 8 < n - j; ++b) quad |= static_cast<uint64_t>(m[j / 8 + b]) << (8 * b);
  return quad & ((uint64_t{1} << (n - j)) - 1u);
}

// One past the last element of entry e's packed tensor.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline const scalar_t* limit_of(const CpuArgs& args, int64_t e, int64_t ndim) {
  int64_t numel = 1;
  for (int64_t d = 0; d < ndim; ++d) numel *= args.entries[e * kEntryCols + kEntryPacked + d];
  return static_cast<const scalar_t*>(args.data[e]) + numel;
}
// The entries covering row `row` of the chunk's parameter, in entry order (s.row_entry, s.row_start), and where
// `pull` is given (the AVX2 and AVX-512 builds) each one's weight and end in pull[k]. Returns how many.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline int64_t enter_row(const ChunkView& v, const CpuArgs& args, const SparseArgs& sp,
                                             const SparseScratch& s, int64_t row, PullEntry* pull) {
  const int64_t count = v.collect_row<false>(
      args.entries, row, s.row_entry, s.row_start,
      [&sp, &v](int64_t e, const int64_t* entry, int64_t r) { return sparse_local_row(sp, v.param, e, entry, r); });
  for (int64_t k = 0; pull != nullptr && k < count; ++k) {
    const int64_t e = s.row_entry[k];
    pull[k].weight = args.entry_weight[e];
    pull[k].limit = limit_of<scalar_t>(args, e, v.ndim);
  }
  return count;
}

#if !HASFL_SPARSE_AVX512
// The portable build, one entry at a time.
// acc[c] += w x(c) and den[c] += w over the set bits c < n of the tile's bitmask m; x is the packed run.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void portable_accumulate(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
                                                    int64_t n, double w, double* acc, double* den) {
  (void)limit;
  for (int64_t j = 0; j < n; j += 16) {
    unsigned bits = bits16(m, j, n);
    while (bits) {
      const int l = __builtin_ctz(bits);
      bits &= bits - 1u;
      acc[j + l] = w * static_cast<double>(*x) + acc[j + l];
      den[j + l] += w;
      ++x;
    }
  }
}

// sums[0] += the 16 lanes of diff and sums[1] += those of square, combined in the fixed tree (8, 4, 2, 1 apart).
HASFL_SPARSE_TARGET inline void add_lanes(double* diff, double* square, double* sums) {
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) {
      diff[l] += diff[l + width];
      square[l] += square[l + width];
    }
  sums[0] += diff[0];
  sums[1] += square[0];
}

// Over the set bits c < n: sums[0] += (x(c) - mean[c])^2, sums[1] += mean[c]^2, in 16 lanes (c mod 16)
// added up in a fixed tree. Meanwhile it prefetches `next`, what pass 1 of the next item reads from this
// entry (its packed run continues there): this pass computes from L1/L2, so memory would idle, and the hardware
// prefetchers give up on dozens of interleaved streams.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void portable_squares(const scalar_t* x, const scalar_t* limit, const uint8_t* m, int64_t n,
                                                 const double* mean, double* sums, const scalar_t* next) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  double diff[16] = {0}, square[16] = {0};
  (void)limit;
  for (int64_t j = 0; j < n; j += 16) {
    __builtin_prefetch(next + j / 16 * kLine);
    unsigned bits = bits16(m, j, n);
    while (bits) {
      const int l = __builtin_ctz(bits);
      bits &= bits - 1u;
      const double d = static_cast<double>(*x) - mean[j + l];
      diff[l] += d * d;
      square[l] += mean[j + l] * mean[j + l];
      ++x;
    }
  }
  add_lanes(diff, square, sums);
}

#endif

#include "aggregate_sparse_avx2.h"
#include "aggregate_sparse_avx2_pull.h"

#if !HASFL_SPARSE_AVX512 && !HASFL_SPARSE_AVX2
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_accumulate(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
                                                  int64_t n, double w, double* acc, double* den) {
  portable_accumulate(x, limit, m, n, w, acc, den);
}

template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_squares(const scalar_t* x, const scalar_t* limit, const uint8_t* m, int64_t n,
                                               const double* mean, double* sums, const scalar_t* next) {
  portable_squares(x, limit, m, n, mean, sums, next);
}
#endif


#if !HASFL_SPARSE_AVX512
// The portable build's chunk (the AVX-512 build's is in aggregate_sparse_pull.h: the same result, bit for bit).
template <typename scalar_t>
HASFL_SPARSE_TARGET void run_sparse_chunk(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                          const SparseScratch& s) {
#if HASFL_SPARSE_AVX2
  if constexpr (sizeof(scalar_t) == 4) {  // float32: aggregate_sparse_avx2_pull.h
    run_sparse_chunk_pull(args, sp, chunk, s);
    return;
  }
#endif
  const ChunkView v(args.params, args.chunks, chunk, kCpuTile);
  const int64_t ndim = v.ndim, length = v.length, tiles = v.tiles, entry_begin = v.entry_begin;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  scalar_t* out = v.output<scalar_t>(args.out);
  int64_t covered = 0;
  int64_t current_row = -1;
  int64_t row_count = 0;
  for (int64_t item = v.item_begin; item < v.item_end; ++item) {
    const int64_t row = v.row_of(item), tile = v.tile_of(item);
    const int64_t c0 = v.first_column(item);
    const int64_t n = v.end_column(item) - c0;
    scalar_t* out_tile = out + row * length + c0;
    if (row != current_row) {
      current_row = row;
      row_count = enter_row<scalar_t>(v, args, sp, s, row, nullptr);
    }
    if (row_count == 0) {
      write_tile_zeros(out_tile, n);
      continue;
    }
    clear_tile_sums(s.acc, s.den, n);
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const scalar_t* x = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k] +
                          sp.tile_prefix[sp.prefix_begin[e] + tile];
      sparse_accumulate(x, limit_of<scalar_t>(args, e, ndim), sp.bits[e] + c0 / 8, n, args.entry_weight[e], s.acc, s.den);
    }
    covered += write_tile_mean(s.acc, s.den, n, s.mean, out_tile);
    for (int64_t j = n; j < n + 16; ++j) s.mean[j] = 0.0;  // the lanes past n of the last 16 are read, masked off
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* prefix = sp.tile_prefix + sp.prefix_begin[e];
      const int64_t held = (tile + 1 < tiles ? prefix[tile + 1] : args.entries[e * kEntryCols + kEntryPacked + ndim - 1]) -
                           prefix[tile];
      const scalar_t* x = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k] + prefix[tile];
      double sums[2] = {0.0, 0.0};
      sparse_squares(x, limit_of<scalar_t>(args, e, ndim), sp.bits[e] + c0 / 8, n, s.mean, sums, x + held);
      part_num[e - entry_begin] += sums[0];
      part_den[e - entry_begin] += sums[1];
    }
  }
  args.chunk_covered[chunk] = covered;
}
#endif
