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
// into the tile (acc = w x + acc, den += w over its set bits; entries in order), the mean is acc / den (0 where
// den is 0), pass 2 computes sum (x - mean)^2 and sum mean^2 over the entry's set bits. The portable build goes
// bit by bit, one entry at a time, and expands again in pass 2. The AVX-512 build lists each entry's 16-column
// words that hold any value (branch-free), expands only those (one load of the next values, then vexpandps) and
// keeps them expanded for pass 2 (SparseScratch::kept), so its work follows the held words rather than the
// covered rows' width, and pass 2 reads L1/L2 only (two entries at once) while prefetching the next item's
// values. Norm partials are 16 lanes (column mod 16) combined in a fixed tree per tile, in both builds. (The
// AVX-512 build's results are bit for bit those of its earlier form, which took 4 entries per pass over every
// word and expanded twice: the same operations per lane, in the same order.)

// SparseScratch is defined in aggregate_cpu.cpp and SparseArgs in aggregate_sparse_host.h, outside the two
// namespaces; clear_tile_sums, write_tile_mean and write_tile_zeros (shared with the dense kernel) in
// aggregate_tile.h, included before this file; ChunkView (the chunk's preamble and row collection) in
// aggregate_layout.h.

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
  int64_t count = 0, j = 0;
  for (; j + 64 <= n; j += 64) {  // 64 columns (4 words) a load
    uint64_t quad;
    std::memcpy(&quad, m + j / 8, 8);
    for (int t = 0; t < 4; ++t) {
      const unsigned bits = static_cast<unsigned>(quad >> (16 * t)) & 0xFFFFu;
      words[count] = static_cast<uint16_t>(j / 16 + t);
      word_bits[count] = static_cast<uint16_t>(bits);
      count += bits != 0;
    }
  }
  for (; j < n; j += 16) {
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

// write_tile_mean (aggregate_tile.h) 8 columns a step: mean[j] = acc[j] / den[j] where den[j] > 0, else 0; out[j]
// = mean[j] rounded to scalar_t (the same IEEE division and rounding, lane for lane). Lanes past n are computed
// from whatever the buffers hold there (they are kCpuTile + 16 long) but neither written to out nor counted.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline int64_t write_tile_mean8(const double* acc, const double* den, int64_t n, double* mean,
                                                    scalar_t* out) {
  int64_t covered = 0;
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 any = _mm512_cmp_pd_mask(_mm512_loadu_pd(den + j), _mm512_setzero_pd(), _CMP_GT_OQ);
    const __mmask8 inside = n - j >= 8 ? static_cast<__mmask8>(0xFFu) : static_cast<__mmask8>((1u << (n - j)) - 1u);
    const __m512d m = _mm512_maskz_div_pd(any, _mm512_loadu_pd(acc + j), _mm512_loadu_pd(den + j));
    _mm512_storeu_pd(mean + j, m);
    if constexpr (sizeof(scalar_t) == 4)
      _mm256_mask_storeu_ps(reinterpret_cast<float*>(out) + j, inside, _mm512_cvtpd_ps(m));
    else
      _mm512_mask_storeu_pd(reinterpret_cast<double*>(out) + j, inside, m);
    covered += __builtin_popcount(static_cast<unsigned>(any & inside));
  }
  return covered;
}

// The 16 lanes of lo (lanes 0-7) and hi (8-15) summed in the fixed tree of the portable build (lane l += lane
// l + width for width 8, 4, 2, 1): each vector add is those scalar adds, lane for lane.
HASFL_SPARSE_TARGET inline double tree16(__m512d lo, __m512d hi) {
  const __m512d s8 = _mm512_add_pd(lo, hi);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

// Pass 2's running sums of one entry: (x - mean)^2 and mean^2 in 16 lanes (column mod 16), each in column order.
struct SquareLanes {
  __m512d a0, a1, b0, b1;
};

// Adds listed word i of an entry (kept: its expanded values) to its lanes.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void square_word(SquareLanes& q, const scalar_t* kept, const uint16_t* words,
                                            const uint16_t* word_bits, int64_t i, const double* mean) {
  const int64_t j = static_cast<int64_t>(words[i]) * 16;
  const unsigned bits = word_bits[i];
  const __mmask8 mlo = static_cast<__mmask8>(bits & 0xFFu), mhi = static_cast<__mmask8>(bits >> 8);
  __m512d lo, hi;
  load_kept(kept + 16 * i, &lo, &hi);
  const __m512d m0 = _mm512_loadu_pd(mean + j), m1 = _mm512_loadu_pd(mean + j + 8);
  const __m512d d0 = _mm512_sub_pd(lo, m0), d1 = _mm512_sub_pd(hi, m1);
  q.a0 = _mm512_mask3_fmadd_pd(d0, d0, q.a0, mlo);
  q.a1 = _mm512_mask3_fmadd_pd(d1, d1, q.a1, mhi);
  q.b0 = _mm512_mask3_fmadd_pd(m0, m0, q.b0, mlo);
  q.b1 = _mm512_mask3_fmadd_pd(m1, m1, q.b1, mhi);
}

// What pass 2 of a row entry reads (pass 1's record) and prefetches (what pass 1 of the next item reads of the
// entry: `next[0, next_len)` and the next tile's bits).
template <typename scalar_t>
struct KeptEntry {
  const scalar_t* kept;
  const uint16_t* words;
  const uint16_t* word_bits;
  int64_t count;
  const scalar_t* next;
  int64_t next_len;
  const uint8_t* next_bits;
};

// Prefetches what pass 1 of the next item reads of an entry, two lines for its listed word i (lines 0 and 1 again
// past its end: the address is clamped rather than the call skipped, because GCC drops a prefetch under a
// condition from such loops).
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void fetch_next(const KeptEntry<scalar_t>& entry, int64_t i) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  const int64_t at = 2 * i * kLine < entry.next_len ? 2 * i * kLine : 0;
  __builtin_prefetch(entry.next + at);
  __builtin_prefetch(entry.next + at + kLine);
}

// Pass 2 of two entries at once (two independent chains of fused multiply-adds, so the loop does not wait on
// one's latency; either entry's words still in order): sums[t][0] += sum (x(c) - mean[c])^2 and sums[t][1] +=
// sum mean[c]^2 over entry t's set bits, in 16 lanes (c mod 16) combined in a fixed tree. `second` may be null.
// Meanwhile it prefetches what pass 1 of the next item reads (two lines a word): memory would idle while this
// pass computes, and the hardware prefetchers give up on dozens of interleaved streams.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_squares_pair(const KeptEntry<scalar_t>& first, const KeptEntry<scalar_t>* second,
                                                    const double* mean, double (*sums)[2]) {
  const KeptEntry<scalar_t>* entries[2] = {&first, second};
  const int count = second ? 2 : 1;
  SquareLanes q[2];
  for (int t = 0; t < count; ++t) {
    __builtin_prefetch(entries[t]->next_bits);
    __builtin_prefetch(entries[t]->next_bits + 64);
    q[t].a0 = q[t].a1 = q[t].b0 = q[t].b1 = _mm512_setzero_pd();
  }
  const int64_t both = second ? min64(first.count, second->count) : 0;
  for (int64_t i = 0; i < both; ++i) {
    fetch_next(first, i);
    fetch_next(*second, i);
    square_word(q[0], first.kept, first.words, first.word_bits, i, mean);
    square_word(q[1], second->kept, second->words, second->word_bits, i, mean);
  }
  for (int t = 0; t < count; ++t) {
    const KeptEntry<scalar_t>& entry = *entries[t];
    for (int64_t i = both; i < entry.count; ++i) {
      fetch_next(entry, i);
      square_word(q[t], entry.kept, entry.words, entry.word_bits, i, mean);
    }
    sums[t][0] += tree16(q[t].a0, q[t].a1);
    sums[t][1] += tree16(q[t].b0, q[t].b1);
  }
}
#endif

template <typename scalar_t>
HASFL_SPARSE_TARGET void run_sparse_chunk(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                          const SparseScratch& s) {
  const ChunkView v(args.params, args.chunks, chunk, kCpuTile);
  const int64_t ndim = v.ndim, length = v.length, tiles = v.tiles, entry_begin = v.entry_begin;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  scalar_t* out = v.output<scalar_t>(args.out);
  const auto local_of = [&sp, &v](int64_t e, const int64_t* entry, int64_t row) {
    return sparse_local_row(sp, v.param, e, entry, row);
  };
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
      row_count = v.collect_row<false>(args.entries, row, s.row_entry, s.row_start, local_of);
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
#if HASFL_SPARSE_AVX512
    covered += write_tile_mean8(s.acc, s.den, n, s.mean, out_tile);
#else
    covered += write_tile_mean(s.acc, s.den, n, s.mean, out_tile);
#endif
    for (int64_t j = n; j < n + 16; ++j) s.mean[j] = 0.0;  // the lanes past n of the last 16 are read, masked off
#if HASFL_SPARSE_AVX512
    for (int64_t k = 0; k < row_count; k += 2) {
      KeptEntry<scalar_t> kept[2];
      const int count = static_cast<int>(min64(2, row_count - k));
      for (int t = 0; t < count; ++t) {
        const int64_t e = s.row_entry[k + t];
        const int64_t* prefix = sp.tile_prefix + sp.prefix_begin[e];
        const int64_t packed_last = args.entries[e * kEntryCols + kEntryPacked + ndim - 1];
        const auto prefix_at = [&](int64_t u) { return u < tiles ? prefix[u] : packed_last; };
        // Pass 1 of the next item reads this entry's run from where this tile's ends (the next tile of the row,
        // or the first of the next row), and the bits of that tile.
        kept[t] = KeptEntry<scalar_t>{static_cast<const scalar_t*>(s.kept) + (k + t) * kCpuTile,
                                      s.words + (k + t) * kWordsPerTile, s.word_bits + (k + t) * kWordsPerTile,
                                      s.word_count[k + t],
                                      static_cast<const scalar_t*>(args.data[e]) + s.row_start[k + t] + prefix_at(tile + 1),
                                      tile + 1 < tiles ? prefix_at(tile + 2) - prefix_at(tile + 1) : prefix_at(1),
                                      sp.bits[e] + (tile + 1 < tiles ? c0 + kCpuTile : 0) / 8};
      }
      double sums[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
      sparse_squares_pair(kept[0], count == 2 ? &kept[1] : nullptr, s.mean, sums);
      for (int t = 0; t < count; ++t) {
        part_num[s.row_entry[k + t] - entry_begin] += sums[t][0];
        part_den[s.row_entry[k + t] - entry_begin] += sums[t][1];
      }
    }
    // At a row's last tile, the next row's first tiles, of the entries that hold it: pass 2's prefetch above
    // fetched each current entry's next local row, which is the next row only where the entry holds both (an
    // index set's rows are a random subset), and nothing of an entry that holds the next row but not this one.
    if (tile + 1 == tiles && item + 1 < v.item_end) {
      constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
      const int64_t next_count = v.collect_row<false>(args.entries, row + 1, s.next_entry, s.next_start, local_of);
      for (int64_t k = 0; k < next_count; ++k) {
        const int64_t e = s.next_entry[k];
        const int64_t len = tiles > 1 ? sp.tile_prefix[sp.prefix_begin[e] + 1]
                                      : args.entries[e * kEntryCols + kEntryPacked + ndim - 1];
        const scalar_t* run = static_cast<const scalar_t*>(args.data[e]) + s.next_start[k];
        for (int64_t off = 0; off < len; off += kLine) __builtin_prefetch(run + off);
        __builtin_prefetch(sp.bits[e]);
      }
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
