// The per-chunk CPU kernel of the fused aggregation for index-set and mask parameters. No include guard on
// purpose: aggregate_cpu.cpp includes it twice, inside namespaces `avx512` and `generic`, with
// HASFL_SPARSE_AVX512 set to 1 (AVX-512 target attribute) or 0 (portable). It must include nothing itself.
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
// into the tile (acc += w x, den += w over its set bits), the mean is acc / den (0 where den is 0), pass 2
// expands again (the bytes are in L1/L2) for sum (x - mean)^2 and sum mean^2 over the entry's set bits.
// The AVX-512 build expands 16 columns at a time (one load of the next values, then vexpandps) for 4 entries per
// load/store of the tile's sums (pass 1) and per load of the mean (pass 2); the portable build goes bit by bit, one
// entry at a time. Norm partials are 16 lanes (column mod 16) combined in a fixed tree per tile, in both builds.

// SparseScratch and SparseArgs are defined in aggregate_cpu.cpp, outside the two namespaces; clear_tile_sums,
// write_tile_mean and write_tile_zeros (shared with the dense kernel) in aggregate_tile.h, included before this file.

#if HASFL_SPARSE_AVX512
// 16 columns [j, j + 16) of one entry: values expanded (0 where the bit is clear) into `kept` and, as doubles, lo/hi. The
// values are read with a plain 64-byte load where the entry's tensor extends that far (`limit`: its end), else a
// masked one (a masked load costs about twice the whole step on AMD Zen 4).
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void expand16(const scalar_t* x, const scalar_t* limit, unsigned bits, __m512d* lo,
                                         __m512d* hi, scalar_t* kept) {
  const __mmask16 m = static_cast<__mmask16>(bits);
  const int count = __builtin_popcount(bits);
  if constexpr (sizeof(scalar_t) == 4) {
    const __m512 v = limit - x >= 16 ? _mm512_loadu_ps(x)
                                     : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), x);
    const __m512 e = _mm512_maskz_expand_ps(m, v);
    _mm512_storeu_ps(kept, e);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  } else {
    const int first = __builtin_popcount(bits & 0xFFu);  // values of the low 8 lanes
    const __m512d a = limit - x >= 8 ? _mm512_loadu_pd(x)
                                     : _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << first) - 1u), x);
    const __m512d b = limit - (x + first) >= 8
                          ? _mm512_loadu_pd(x + first)
                          : _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << (count - first)) - 1u), x + first);
    *lo = _mm512_maskz_expand_pd(static_cast<__mmask8>(bits & 0xFFu), a);
    *hi = _mm512_maskz_expand_pd(static_cast<__mmask8>(bits >> 8), b);
    _mm512_storeu_pd(kept, *lo);
    _mm512_storeu_pd(kept + 8, *hi);
  }
}
#endif

// The bits of columns [j, j + 16) of a tile of n columns (j a multiple of 16; bits past n cleared).
HASFL_SPARSE_TARGET inline unsigned bits16(const uint8_t* m, int64_t j, int64_t n) {
  unsigned bits = m[j / 8];
  if (j + 8 < n) bits |= static_cast<unsigned>(m[j / 8 + 1]) << 8;
  if (n - j < 16) bits &= (1u << (n - j)) - 1u;
  return bits;
}

// One past the last element of entry e's packed tensor.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline const scalar_t* limit_of(const CpuArgs& args, int64_t e, int64_t ndim) {
  int64_t numel = 1;
  for (int64_t d = 0; d < ndim; ++d) numel *= args.entries[e * kEntryCols + kEntryPacked + d];
  return static_cast<const scalar_t*>(args.data[e]) + numel;
}
#if !HASFL_SPARSE_AVX512
// The portable build, one entry at a time (the AVX-512 build takes 4 at once, below).
// acc[c] += w x(c) and den[c] += w over the set bits c < n of the tile's bitmask m; x is the packed run.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_accumulate(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
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

// Over the set bits c < n: sums[0] += (x(c) - mean[c])^2, sums[1] += mean[c]^2, in 16 lanes (c mod 16)
// added up in a fixed tree. Meanwhile it prefetches `next`, what pass 1 of the next item reads from this
// entry (its packed run continues there): this pass computes from L1/L2, so memory would idle, and the hardware
// prefetchers give up on dozens of interleaved streams.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_squares(const scalar_t* x, const scalar_t* limit, const uint8_t* m, int64_t n,
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
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) {
      diff[l] += diff[l + width];
      square[l] += square[l + width];
    }
  sums[0] += diff[0];
  sums[1] += square[0];
}

#endif

#if HASFL_SPARSE_AVX512
// Pass 1 of one entry over a tile of n columns (x: its packed run, m: the tile's bits): first the 16-column
// words holding any value are listed (words, word_bits; branch-free, so random bit patterns cost no mispredicted
// jumps), then each listed word is expanded once, added to the tile's sums (acc[c] = w x(c) + acc[c], one fused
// multiply-add, den[c] += w over the set bits) and kept, expanded, for pass 2 (kept[16 i, 16 i + 16): listed
// word i). Returns the number of listed words. The work follows the held words, not the row's width.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline int64_t sparse_accumulate_entry(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
                                                           int64_t n, double w, double* acc, double* den,
                                                           scalar_t* kept, uint16_t* words, uint16_t* word_bits) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const unsigned bits = bits16(m, j, n);
    words[count] = static_cast<uint16_t>(j / 16);
    word_bits[count] = static_cast<uint16_t>(bits);
    count += bits != 0;
  }
  const __m512d wv = _mm512_set1_pd(w);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = static_cast<int64_t>(words[i]) * 16;
    const unsigned bits = word_bits[i];
    __m512d lo, hi;
    expand16(x, limit, bits, &lo, &hi, kept + 16 * i);
    x += __builtin_popcount(bits);
    _mm512_storeu_pd(acc + j, _mm512_fmadd_pd(wv, lo, _mm512_loadu_pd(acc + j)));
    _mm512_storeu_pd(acc + j + 8, _mm512_fmadd_pd(wv, hi, _mm512_loadu_pd(acc + j + 8)));
    const __m512d d0 = _mm512_loadu_pd(den + j), d1 = _mm512_loadu_pd(den + j + 8);
    _mm512_storeu_pd(den + j, _mm512_mask_add_pd(d0, static_cast<__mmask8>(bits & 0xFFu), d0, wv));
    _mm512_storeu_pd(den + j + 8, _mm512_mask_add_pd(d1, static_cast<__mmask8>(bits >> 8), d1, wv));
  }
  return count;
}

// The 16 expanded values of a kept word as doubles.
HASFL_SPARSE_TARGET inline void load_kept(const float* kept, __m512d* lo, __m512d* hi) {
  *lo = _mm512_cvtps_pd(_mm256_loadu_ps(kept));
  *hi = _mm512_cvtps_pd(_mm256_loadu_ps(kept + 8));
}
HASFL_SPARSE_TARGET inline void load_kept(const double* kept, __m512d* lo, __m512d* hi) {
  *lo = _mm512_loadu_pd(kept);
  *hi = _mm512_loadu_pd(kept + 8);
}

// Pass 2 of one entry from what its pass 1 kept: sums[0] += sum (x(c) - mean[c])^2 and sums[1] += sum mean[c]^2
// over its set bits, in 16 lanes (c mod 16, each in column order) combined in a fixed tree. Meanwhile it
// prefetches `next[0, next_len)`, what pass 1 of the next item reads of this entry (two lines a word), and
// `next_bits` (the next tile's bits): memory would idle while this pass computes, and the hardware prefetchers
// give up on dozens of interleaved streams.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_squares_entry(const scalar_t* kept, const uint16_t* words,
                                                     const uint16_t* word_bits, int64_t count, const double* mean,
                                                     double* sums, const scalar_t* next, int64_t next_len,
                                                     const uint8_t* next_bits) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  __builtin_prefetch(next_bits);
  __builtin_prefetch(next_bits + 64);
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
  for (int64_t i = 0; i < count; ++i) {
    if (2 * i * kLine < next_len) {
      __builtin_prefetch(next + 2 * i * kLine);
      __builtin_prefetch(next + (2 * i + 1) * kLine);
    }
    const int64_t j = static_cast<int64_t>(words[i]) * 16;
    const unsigned bits = word_bits[i];
    const __mmask8 mlo = static_cast<__mmask8>(bits & 0xFFu), mhi = static_cast<__mmask8>(bits >> 8);
    __m512d lo, hi;
    load_kept(kept + 16 * i, &lo, &hi);
    const __m512d m0 = _mm512_loadu_pd(mean + j), m1 = _mm512_loadu_pd(mean + j + 8);
    const __m512d d0 = _mm512_sub_pd(lo, m0), d1 = _mm512_sub_pd(hi, m1);
    a0 = _mm512_mask3_fmadd_pd(d0, d0, a0, mlo);
    a1 = _mm512_mask3_fmadd_pd(d1, d1, a1, mhi);
    b0 = _mm512_mask3_fmadd_pd(m0, m0, b0, mlo);
    b1 = _mm512_mask3_fmadd_pd(m1, m1, b1, mhi);
  }
  double diff[16], square[16];
  _mm512_storeu_pd(diff, a0);
  _mm512_storeu_pd(diff + 8, a1);
  _mm512_storeu_pd(square, b0);
  _mm512_storeu_pd(square + 8, b1);
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) {
      diff[l] += diff[l + width];
      square[l] += square[l + width];
    }
  sums[0] += diff[0];
  sums[1] += square[0];
}
#endif

template <typename scalar_t>
HASFL_SPARSE_TARGET void run_sparse_chunk(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                          const SparseScratch& s) {
  const int64_t* chunk_row = args.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = args.params + p * kParamCols;
  const int64_t ndim = param[kParamNdim];
  const int64_t length = row_length(param);
  const int64_t tiles = tiles_per_row(param, kCpuTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  double* part_num = args.partial_num + chunk_row[kChunkPartialBase];
  double* part_den = args.partial_den + chunk_row[kChunkPartialBase];
  scalar_t* out = static_cast<scalar_t*>(args.out) + param[kParamOutOffset];
  int64_t covered = 0;
  int64_t current_row = -1;
  int64_t row_count = 0;
  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles, tile = item % tiles;
    const int64_t c0 = tile * kCpuTile;
    const int64_t n = min64(c0 + kCpuTile, length) - c0;
    scalar_t* out_tile = out + row * length + c0;
    if (row != current_row) {
      current_row = row;
      row_count = 0;
      for (int64_t e = entry_begin; e < entry_end; ++e) {
        const int64_t* entry = args.entries + e * kEntryCols;
        int64_t local = 0, stride = 1, rest = row;
        bool hit = true;
        for (int64_t d = ndim - 2; d >= 0; --d) {
          const int64_t full = param[kParamFull + d];
          const int32_t index = sp.row_map[sp.row_map_begin[e * kMaxDims + d] + rest % full];
          rest /= full;
          if (index < 0) {
            hit = false;
            break;
          }
          local += index * stride;
          stride *= entry[kEntryPacked + d];
        }
        if (!hit) continue;
        s.row_entry[row_count] = e;
        s.row_start[row_count] = local * entry[kEntryPacked + ndim - 1];
        ++row_count;
      }
    }
    if (row_count == 0) {
      write_tile_zeros(out_tile, n);
      continue;
    }
    clear_tile_sums(s.acc, s.den, n);
#if HASFL_SPARSE_AVX512
    // Entries one at a time, in order (per column: acc = w x + acc, entry by entry, as in the portable build).
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const scalar_t* x = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k] +
                          sp.tile_prefix[sp.prefix_begin[e] + tile];
      s.word_count[k] = sparse_accumulate_entry(x, limit_of<scalar_t>(args, e, ndim), sp.bits[e] + c0 / 8, n,
                                                args.entry_weight[e], s.acc, s.den,
                                                static_cast<scalar_t*>(s.kept) + k * kCpuTile, s.words + k * kWordsPerTile,
                                                s.word_bits + k * kWordsPerTile);
    }
#else
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const scalar_t* x = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k] +
                          sp.tile_prefix[sp.prefix_begin[e] + tile];
      sparse_accumulate(x, limit_of<scalar_t>(args, e, ndim), sp.bits[e] + c0 / 8, n, args.entry_weight[e], s.acc, s.den);
    }
#endif
    covered += write_tile_mean(s.acc, s.den, n, s.mean, out_tile);
    for (int64_t j = n; j < n + 16; ++j) s.mean[j] = 0.0;  // the lanes past n of the last 16 are read, masked off
#if HASFL_SPARSE_AVX512
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* prefix = sp.tile_prefix + sp.prefix_begin[e];
      const int64_t packed_last = args.entries[e * kEntryCols + kEntryPacked + ndim - 1];
      const auto prefix_at = [&](int64_t t) { return t < tiles ? prefix[t] : packed_last; };
      // Pass 1 of the next item reads this entry's run from where this tile's ends (the next tile of the row, or
      // the first of the next row), and the bits of that tile.
      const scalar_t* next = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k] + prefix_at(tile + 1);
      const int64_t next_len = tile + 1 < tiles ? prefix_at(tile + 2) - prefix_at(tile + 1) : prefix_at(1);
      const uint8_t* next_bits = sp.bits[e] + (tile + 1 < tiles ? c0 + kCpuTile : 0) / 8;
      double sums[2] = {0.0, 0.0};
      sparse_squares_entry(static_cast<const scalar_t*>(s.kept) + k * kCpuTile, s.words + k * kWordsPerTile,
                           s.word_bits + k * kWordsPerTile, s.word_count[k], s.mean, sums, next, next_len, next_bits);
      part_num[e - entry_begin] += sums[0];
      part_den[e - entry_begin] += sums[1];
    }
#else
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
#endif
  }
  args.chunk_covered[chunk] = covered;
}
