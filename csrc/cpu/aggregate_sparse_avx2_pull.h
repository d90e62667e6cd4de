// The AVX2 build's chunk for float32 index sets and masks: pass 1 pulls, pass 2 goes an entry at a time. No include
// guard on purpose: aggregate_sparse_kernel.h includes it inside namespace `avx2sparse` (HASFL_SPARSE_AVX2 = 1),
// after aggregate_sparse_avx2.h (kBytes, nibble_lanes, add_lanes). It must include nothing itself.
//
// Bit for bit the portable build's result (the same multiplies and adds, never fused, in the same order per column
// and per norm lane); only the loop nest and the branches differ:
//   pass 1: for each 16 columns of a tile, every covering entry in entry order adds its values there to 4 + 4
//           vectors held in registers (acc = w x + acc, den += w on the set bits), its 16 bits expanded a byte at a
//           time by one permutation whatever they hold (no branch on the bits: a random mask's bytes are empty or
//           not at random, and each mispredicted branch cost more than the byte's work); the mean of the 16
//           columns, acc / den (+0 where den is 0), is written to the output and kept for pass 2;
//   pass 2: per entry, its norm lanes in registers over the tile, each byte expanded again without a branch.
// A clear lane holds +0 after the expansion, where acc + w (+0) is acc and den + (+0) is den (neither is ever -0:
// both start at +0), and the norm lanes add +0 (sums of squares).

#if HASFL_SPARSE_AVX2
// byte m: float lane l all ones where bit l of m is set.
struct ByteLanes {
  alignas(32) int32_t lanes[256][8];
  constexpr ByteLanes() : lanes() {
    for (int m = 0; m < 256; ++m)
      for (int l = 0; l < 8; ++l) lanes[m][l] = ((m >> l) & 1) ? -1 : 0;
  }
};
inline constexpr ByteLanes kByteLanes{};

// The 8 columns of byte `byte` as floats: its popcount(byte) next values of x in its set lanes, +0 elsewhere.
// Reads 8 values where they lie before `limit`, else exactly its count (a masked load: nothing past the entry).
template <bool kChecked = true>
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline __m256 byte_floats(const float* x, const float* limit,
                                                                              unsigned byte) {
  const __m256 v = !kChecked || x + 8 <= limit ? _mm256_loadu_ps(x)
                                  : _mm256_maskload_ps(x, _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                                              kBytes.prefix[__builtin_popcount(byte)])));
  const __m256 e = _mm256_permutevar8x32_ps(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kBytes.expand[byte])));
  return _mm256_and_ps(e, _mm256_load_ps(reinterpret_cast<const float*>(kByteLanes.lanes[byte])));
}

HASFL_SPARSE_TARGET __attribute__((always_inline)) inline __m256d low_doubles(__m256 e) {
  return _mm256_cvtps_pd(_mm256_castps256_ps128(e));
}
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline __m256d high_doubles(__m256 e) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
}

// The 16 bits of columns [j, j + 16) of a tile of n columns: bits16, with one 2-byte load where all 16 lie before n.
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline unsigned word_bits(const uint8_t* m, int64_t j, int64_t n) {
  if (n - j >= 16) {
    uint16_t word;
    std::memcpy(&word, m + j / 8, 2);
    return word;
  }
  return bits16(m, j, n);
}

// The 16 columns of a word (bits) of an entry whose next values start at x, a byte at a time (e0: columns 0-7, e1:
// 8-15); returns where the word's values end. Unchecked loads where 16 values lie before `limit` (a word takes at
// most 16), each byte's checked otherwise. kRuns: each byte's set bits are a run from its first column (sp.runs: a
// channel index set's whole words, a slice's prefix), so a byte's values are a load of its first c lanes, with no
// permutation (the same lanes, the same +0 elsewhere).
template <bool kRuns>
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline const float* word_floats(const float* x, const float* limit,
                                                                                   unsigned bits, __m256* e0,
                                                                                   __m256* e1) {
  const unsigned b0 = bits & 0xFFu, b1 = bits >> 8;
  const int c0 = __builtin_popcount(b0);
  if (kRuns) {  // each byte's set bits a run from its first lane: its values are the next c, in its first c lanes
    const int c1 = __builtin_popcount(b1);
    const __m256i m0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kBytes.prefix[c0]));
    const __m256i m1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kBytes.prefix[c1]));
    if (x + 16 <= limit) {
      *e0 = _mm256_and_ps(_mm256_loadu_ps(x), _mm256_castsi256_ps(m0));
      *e1 = _mm256_and_ps(_mm256_loadu_ps(x + c0), _mm256_castsi256_ps(m1));
    } else {
      *e0 = _mm256_maskload_ps(x, m0);
      *e1 = _mm256_maskload_ps(x + c0, m1);
    }
    return x + c0 + c1;
  }
  if (x + 16 <= limit) {
    *e0 = byte_floats<false>(x, limit, b0);
    *e1 = byte_floats<false>(x + c0, limit, b1);
  } else {
    *e0 = byte_floats<true>(x, limit, b0);
    *e1 = byte_floats<true>(x + c0, limit, b1);
  }
  return x + c0 + __builtin_popcount(b1);
}

// v with its NaN lanes kCanonicalNan.
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline __m256d canonical_nan(__m256d v) {
  return _mm256_blendv_pd(v, _mm256_set1_pd(kCanonicalNan), _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
}

// Pass 1 over one tile of n columns: the entries' packed runs start at pull[k].at (advanced here), their bitmasks at
// pull[k].bits. Writes the mean to out_tile[0, n) and mean[0, n rounded up to 16) (+0 past n); returns the columns
// covered.
template <bool kRuns>
HASFL_SPARSE_TARGET inline int64_t pull_tile_means(PullEntry* pull, int64_t count, int64_t n, double* mean,
                                                   double* mean2, float* out_tile) {
  int64_t covered = 0;
  for (int64_t j = 0; j < n; j += 16) {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m256d den0 = acc0, den1 = acc0, den2 = acc0, den3 = acc0;
    for (int64_t k = 0; k < count; ++k) {
      PullEntry& entry = pull[k];
      const unsigned bits = word_bits(entry.bits, j, n);
      const float* x = static_cast<const float*>(entry.at);
      __builtin_prefetch(x + 64);
      const unsigned b0 = bits & 0xFFu, b1 = bits >> 8;
      __m256 e0, e1;
      entry.at = word_floats<kRuns>(x, static_cast<const float*>(entry.limit), bits, &e0, &e1);
      const __m256d wv = _mm256_broadcast_sd(&entry.weight);
      acc0 = _mm256_add_pd(_mm256_mul_pd(wv, low_doubles(e0)), acc0);
      acc1 = _mm256_add_pd(_mm256_mul_pd(wv, high_doubles(e0)), acc1);
      acc2 = _mm256_add_pd(_mm256_mul_pd(wv, low_doubles(e1)), acc2);
      acc3 = _mm256_add_pd(_mm256_mul_pd(wv, high_doubles(e1)), acc3);
      den0 = _mm256_add_pd(den0, _mm256_and_pd(wv, nibble_lanes(b0 & 15u)));
      den1 = _mm256_add_pd(den1, _mm256_and_pd(wv, nibble_lanes(b0 >> 4)));
      den2 = _mm256_add_pd(den2, _mm256_and_pd(wv, nibble_lanes(b1 & 15u)));
      den3 = _mm256_add_pd(den3, _mm256_and_pd(wv, nibble_lanes(b1 >> 4)));
    }
    const __m256d zero = _mm256_setzero_pd();
    const __m256d any0 = _mm256_cmp_pd(den0, zero, _CMP_GT_OQ), any1 = _mm256_cmp_pd(den1, zero, _CMP_GT_OQ);
    const __m256d any2 = _mm256_cmp_pd(den2, zero, _CMP_GT_OQ), any3 = _mm256_cmp_pd(den3, zero, _CMP_GT_OQ);
    // acc / den where den > 0, else +0 (0 / 0's NaN masked off), as the portable build's `any ? acc / den : 0.0`;
    // a NaN as kCanonicalNan (write_tile_mean's: which NaN an add of two returns depends on its operand order).
    const __m256d m0 = canonical_nan(_mm256_and_pd(_mm256_div_pd(acc0, den0), any0));
    const __m256d m1 = canonical_nan(_mm256_and_pd(_mm256_div_pd(acc1, den1), any1));
    const __m256d m2 = canonical_nan(_mm256_and_pd(_mm256_div_pd(acc2, den2), any2));
    const __m256d m3 = canonical_nan(_mm256_and_pd(_mm256_div_pd(acc3, den3), any3));
    _mm256_storeu_pd(mean + j, m0);
    _mm256_storeu_pd(mean + j + 4, m1);
    _mm256_storeu_pd(mean + j + 8, m2);
    _mm256_storeu_pd(mean + j + 12, m3);
    // mean^2 once for every entry's pass 2 (the same product it took per entry: (mean & keep)^2 = mean^2 & keep).
    _mm256_storeu_pd(mean2 + j, _mm256_mul_pd(m0, m0));
    _mm256_storeu_pd(mean2 + j + 4, _mm256_mul_pd(m1, m1));
    _mm256_storeu_pd(mean2 + j + 8, _mm256_mul_pd(m2, m2));
    _mm256_storeu_pd(mean2 + j + 12, _mm256_mul_pd(m3, m3));
    const __m256 lo = _mm256_set_m128(_mm256_cvtpd_ps(m1), _mm256_cvtpd_ps(m0));
    const __m256 hi = _mm256_set_m128(_mm256_cvtpd_ps(m3), _mm256_cvtpd_ps(m2));
    if (n - j >= 16) {
      _mm256_storeu_ps(out_tile + j, lo);
      _mm256_storeu_ps(out_tile + j + 8, hi);
    } else {  // the tile's last columns: exactly n - j of them
      const int64_t rest = n - j;
      _mm256_maskstore_ps(out_tile + j, _mm256_load_si256(reinterpret_cast<const __m256i*>(kBytes.prefix[rest < 8 ? rest : 8])), lo);
      if (rest > 8)
        _mm256_maskstore_ps(out_tile + j + 8, _mm256_load_si256(reinterpret_cast<const __m256i*>(kBytes.prefix[rest - 8])), hi);
    }
    // Columns past n have no set bit (bits16 clears them): den is 0 there and they are not counted.
    covered += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_pd(any0) | (_mm256_movemask_pd(any1) << 4) |
                                                        (_mm256_movemask_pd(any2) << 8) | (_mm256_movemask_pd(any3) << 12)));
  }
  return covered;
}

// Pass 2 for one entry over a tile of n columns: the portable build's norm sums over its set bits (16 lanes, column
// mod 16, in its tree), from its packed run at x, each byte expanded without a branch; prefetches `next` (the entry's
// run of the next item) as the portable build does.
template <bool kRuns>
HASFL_SPARSE_TARGET inline void pull_tile_squares(const float* x, const float* limit, const uint8_t* m, int64_t n,
                                                  const double* mean, const double* mean2, double* sums,
                                                  const float* next) {
  __m256d diff[4], square[4];
  for (int q = 0; q < 4; ++q) diff[q] = square[q] = _mm256_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    __builtin_prefetch(next + j);
    const unsigned bits = word_bits(m, j, n);
    __m256 e0, e1;
    x = word_floats<kRuns>(x, limit, bits, &e0, &e1);
    const __m256d v[4] = {low_doubles(e0), high_doubles(e0), low_doubles(e1), high_doubles(e1)};
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m256d keep = nibble_lanes((bits >> (4 * q)) & 15u);
      const __m256d mu = _mm256_loadu_pd(mean + j + 4 * q);
      const __m256d d = _mm256_and_pd(_mm256_sub_pd(v[q], mu), keep);
      diff[q] = _mm256_add_pd(diff[q], _mm256_mul_pd(d, d));
      square[q] = _mm256_add_pd(square[q], _mm256_and_pd(_mm256_loadu_pd(mean2 + j + 4 * q), keep));
    }
  }
  alignas(32) double lanes_diff[16], lanes_square[16];
  for (int q = 0; q < 4; ++q) {
    _mm256_store_pd(lanes_diff + 4 * q, diff[q]);
    _mm256_store_pd(lanes_square + 4 * q, square[q]);
  }
  add_lanes(lanes_diff, lanes_square, sums);
}

// Pass 2 for an entry holding few of the tile's columns: the portable build's loop over its set bits (the same
// lanes, column mod 16, and the same products and adds in column order), 64 columns a step, so a word's few
// values cost a few instructions each instead of the 16 columns' vector work, and the loop's exit is mispredicted
// once per 64 columns rather than per word. `next` is prefetched as pull_tile_squares prefetches it.
HASFL_SPARSE_TARGET inline void push_tile_squares(const float* x, const uint8_t* m, int64_t n, const double* mean,
                                                  const double* mean2, double* sums, const float* next) {
  double diff[16] = {0}, square[16] = {0};
  for (int64_t j = 0; j < n; j += 64) {
    for (int64_t l = 0; l < 64; l += 16) __builtin_prefetch(next + j + l);
    uint64_t quad = bits64(m, j, n);
    while (quad) {
      const int64_t c = j + __builtin_ctzll(quad);
      quad &= quad - 1u;
      const double d = static_cast<double>(*x++) - mean[c];
      diff[c & 15] += d * d;
      square[c & 15] += mean2[c];
    }
  }
  add_lanes(diff, square, sums);
}

// An entry holding at most 1 in kPushBelow of a tile's columns takes push_tile_squares (one thread, 50 EMNIST clients:
// masks 1.11x faster at 3, 1.10x at 4 and at 2; index sets 1.02x at 3, 1.06x slower at 2).
constexpr int64_t kPushBelow = 3;

// The chunk (float32 entries): the portable build's items, rows and partials, with the two passes above.
template <bool kRuns>
HASFL_SPARSE_TARGET void pull_chunk(const CpuArgs& args, const SparseArgs& sp, int64_t chunk, const SparseScratch& s) {
  const ChunkView v(args.params, args.chunks, chunk, kCpuTile);
  const int64_t length = v.length, entry_begin = v.entry_begin;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  float* out = v.output<float>(args.out);
  PullEntry* pull = s.pull;
  int64_t covered = 0, current_row = -1, row_count = 0;
  for (int64_t item = v.item_begin; item < v.item_end; ++item) {
    const int64_t row = v.row_of(item), tile = v.tile_of(item);
    const int64_t c0 = v.first_column(item);
    const int64_t n = v.end_column(item) - c0;
    float* out_tile = out + row * length + c0;
    if (row != current_row) {
      current_row = row;
      row_count = enter_row<float>(v, args, sp, s, row, pull);
    }
    if (row_count == 0) {
      write_tile_zeros(out_tile, n);
      continue;
    }
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      pull[k].run = pull[k].at = static_cast<const float*>(args.data[e]) + s.row_start[k] +
                                 sp.tile_prefix[sp.prefix_begin[e] + tile];
      pull[k].bits = sp.bits[e] + c0 / 8;
    }
    covered += pull_tile_means<kRuns>(pull, row_count, n, s.mean, s.acc, out_tile);  // s.acc: mean^2
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const float* x = static_cast<const float*>(pull[k].run);
      const float* end = static_cast<const float*>(pull[k].at);  // where pass 1 left it: the next item's run
      double sums[2] = {0.0, 0.0};
      if ((end - x) * kPushBelow <= n)
        push_tile_squares(x, pull[k].bits, n, s.mean, s.acc, sums, end);
      else
        pull_tile_squares<kRuns>(x, static_cast<const float*>(pull[k].limit), pull[k].bits, n, s.mean, s.acc, sums,
                                 end);
      part_num[e - entry_begin] += sums[0];
      part_den[e - entry_begin] += sums[1];
    }
  }
  args.chunk_covered[chunk] = covered;
}

// The chunk (float32 entries): the run-word loads where every word of the parameter's entries is a run from its
// first column (sp.runs), else each byte expanded.
HASFL_SPARSE_TARGET void run_sparse_chunk_pull(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                               const SparseScratch& s) {
  if (sp.runs != nullptr && sp.runs[args.chunks[chunk * kChunkCols + kChunkParam]])
    pull_chunk<true>(args, sp, chunk, s);
  else
    pull_chunk<false>(args, sp, chunk, s);
}
#endif
