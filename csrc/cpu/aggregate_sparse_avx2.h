// The AVX2 build of the sparse CPU kernel (a CPU with AVX2 but not AVX-512). No include guard on purpose:
// aggregate_sparse_kernel.h includes it where its portable functions (bits16, portable_accumulate, portable_squares,
// add_lanes) are defined, inside namespace `avx2sparse` with HASFL_SPARSE_AVX2 set to 1. It must include nothing
// itself.

#if HASFL_SPARSE_AVX2
// The AVX2 build (a CPU with AVX2 but not AVX-512), one entry at a time as the portable build above and with its
// arithmetic, bit for bit: a multiply and an add, never fused (its target has no FMA), in the same order per column
// and per norm lane. Float64 entries go 4 columns at a time here, where an entry's bits fill its nibbles enough
// (float32 entries: aggregate_sparse_avx2_pull.h, 16 columns a step over every covering entry). A nibble's set bits
// take the next values of the packed run, expanded into their lanes by a permutation and +0 in the clear lanes, where acc + w x (+0) is acc
// and den + (+0) is den (neither is ever -0: both start at +0), and the norms' lanes add +0.
struct Nibbles {
  alignas(32) int32_t expand[16][8];  // nibble m: double lane l takes the packed value of its rank among m's bits
  alignas(32) int64_t lanes[16][4];   // nibble m: lane l all ones where bit l is set
  alignas(32) int64_t prefix[5][4];   // the first c lanes all ones (a load of exactly c values)
  constexpr Nibbles() : expand(), lanes(), prefix() {
    for (int m = 0; m < 16; ++m) {
      int rank = 0;
      for (int l = 0; l < 4; ++l) {
        const bool set = (m >> l) & 1;
        expand[m][2 * l] = 2 * (set ? rank : 0);
        expand[m][2 * l + 1] = 2 * (set ? rank : 0) + 1;
        lanes[m][l] = set ? -1 : 0;
        rank += set ? 1 : 0;
      }
    }
    for (int c = 0; c <= 4; ++c)
      for (int l = 0; l < 4; ++l) prefix[c][l] = l < c ? -1 : 0;
  }
};
inline constexpr Nibbles kNibbles{};

HASFL_SPARSE_TARGET inline __m256d nibble_lanes(unsigned nib) {
  return _mm256_castsi256_pd(_mm256_load_si256(reinterpret_cast<const __m256i*>(kNibbles.lanes[nib])));
}

// The nibble's first popcount(nib) lanes of v moved to its set lanes, +0 in the clear ones (v itself for a full one).
HASFL_SPARSE_TARGET inline __m256d expand_nibble(__m256d v, unsigned nib) {
  if (nib == 15u) return v;
  const __m256i order = _mm256_load_si256(reinterpret_cast<const __m256i*>(kNibbles.expand[nib]));
  return _mm256_and_pd(_mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps(v), order)), nibble_lanes(nib));
}

// The 4 columns of nibble `nib` as doubles: its popcount(nib) next values of x in its set lanes, +0 elsewhere;
// reads exactly those values (a masked load).
HASFL_SPARSE_TARGET inline __m256d nibble_values(const float* x, unsigned nib) {
  const int count = __builtin_popcount(nib);
  const __m128i prefix = _mm_setr_epi32(count > 0 ? -1 : 0, count > 1 ? -1 : 0, count > 2 ? -1 : 0, count > 3 ? -1 : 0);
  const __m256d v = _mm256_cvtps_pd(count == 4 ? _mm_loadu_ps(x) : _mm_maskload_ps(x, prefix));
  return expand_nibble(v, nib);
}

HASFL_SPARSE_TARGET inline __m256d nibble_values(const double* x, unsigned nib) {
  const int count = __builtin_popcount(nib);
  const __m256d v = count == 4 ? _mm256_loadu_pd(x)
                               : _mm256_maskload_pd(x, _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                                           kNibbles.prefix[count])));
  return expand_nibble(v, nib);
}

// acc[c] = w x(c) + acc[c] and den[c] += w over the set bits c < n (the portable build's, 4 columns at a time; the
// lanes of a nibble past n are clear, so acc and den up to n rounded up to 16 are read and written unchanged).
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void nibble_accumulate(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
                                                  int64_t n, double w, double* acc, double* den) {
  (void)limit;
  const __m256d wv = _mm256_set1_pd(w);
  for (int64_t j = 0; j < n; j += 16) {
    const unsigned bits = bits16(m, j, n);
    if (!bits) continue;
    for (int q = 0; q < 4; ++q) {
      const unsigned nib = (bits >> (4 * q)) & 15u;
      if (!nib) continue;
      const __m256d v = nibble_values(x, nib);
      x += __builtin_popcount(nib);
      double* a = acc + j + 4 * q;
      double* d = den + j + 4 * q;
      _mm256_storeu_pd(a, _mm256_add_pd(_mm256_mul_pd(wv, v), _mm256_loadu_pd(a)));
      _mm256_storeu_pd(d, _mm256_add_pd(_mm256_loadu_pd(d), _mm256_and_pd(wv, nibble_lanes(nib))));
    }
  }
}

// The portable build's norm sums over the set bits c < n, in its 16 lanes (c mod 16: 4 vectors of 4) and its tree.
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void nibble_squares(const scalar_t* x, const scalar_t* limit, const uint8_t* m, int64_t n,
                                               const double* mean, double* sums, const scalar_t* next) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  (void)limit;
  __m256d diff[4], square[4];
  for (int q = 0; q < 4; ++q) diff[q] = square[q] = _mm256_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    __builtin_prefetch(next + j / 16 * kLine);
    const unsigned bits = bits16(m, j, n);
    if (!bits) continue;
    for (int q = 0; q < 4; ++q) {
      const unsigned nib = (bits >> (4 * q)) & 15u;
      if (!nib) continue;
      const __m256d keep = nibble_lanes(nib);
      const __m256d v = nibble_values(x, nib);
      x += __builtin_popcount(nib);
      const __m256d mu = _mm256_loadu_pd(mean + j + 4 * q);
      const __m256d d = _mm256_and_pd(_mm256_sub_pd(v, mu), keep);
      const __m256d kept_mean = _mm256_and_pd(mu, keep);
      diff[q] = _mm256_add_pd(diff[q], _mm256_mul_pd(d, d));
      square[q] = _mm256_add_pd(square[q], _mm256_mul_pd(kept_mean, kept_mean));
    }
  }
  alignas(32) double lanes_diff[16], lanes_square[16];
  for (int q = 0; q < 4; ++q) {
    _mm256_store_pd(lanes_diff + 4 * q, diff[q]);
    _mm256_store_pd(lanes_square + 4 * q, square[q]);
  }
  add_lanes(lanes_diff, lanes_square, sums);
}

// Float32 entries go a byte (8 columns) at a time, in aggregate_sparse_avx2_pull.h; its tables.
struct Bytes {
  alignas(32) int32_t expand[256][8];  // byte m: float lane l takes the packed value of its rank among m's bits
  alignas(32) int32_t prefix[9][8];    // the first c lanes all ones (a load of exactly c values)
  constexpr Bytes() : expand(), prefix() {
    for (int m = 0; m < 256; ++m) {
      int rank = 0;
      for (int l = 0; l < 8; ++l) {
        const bool set = (m >> l) & 1;
        expand[m][l] = set ? rank : 0;
        rank += set ? 1 : 0;
      }
    }
    for (int c = 0; c <= 8; ++c)
      for (int l = 0; l < 8; ++l) prefix[c][l] = l < c ? -1 : 0;
  }
};
inline constexpr Bytes kBytes{};

// Whether the set bits c < n of a tile come in whole nibbles enough for the nibble path: at least three quarters of
// the lanes of its nonempty nibbles set (index sets' runs of k x k columns, dense masks). Other masks (a width-0.25
// client's random 7 %: one value in a quarter of its nibbles; at half, 56 %, 2.2 values a nibble) go bit by bit, as
// the portable build does, which costs them less (one thread, bench aggregate --layout mask: a threshold of one half
// was 1.1-1.2x slower than the portable build, three quarters 1.0-1.4x faster). Either way the same bits.
HASFL_SPARSE_TARGET inline bool fills_nibbles(const uint8_t* m, int64_t n) {
  int64_t held = 0, nibbles = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const unsigned bits = bits16(m, j, n);
    held += __builtin_popcount(bits);
    nibbles += __builtin_popcount((bits | bits >> 1 | bits >> 2 | bits >> 3) & 0x1111u);
  }
  return 4 * held >= 3 * 4 * nibbles;
}

// Float64 entries (float32 ones take run_sparse_chunk_pull, aggregate_sparse_avx2_pull.h).
template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_accumulate(const scalar_t* x, const scalar_t* limit, const uint8_t* m,
                                                  int64_t n, double w, double* acc, double* den) {
  if (fills_nibbles(m, n))
    nibble_accumulate(x, limit, m, n, w, acc, den);
  else
    portable_accumulate(x, limit, m, n, w, acc, den);
}

template <typename scalar_t>
HASFL_SPARSE_TARGET inline void sparse_squares(const scalar_t* x, const scalar_t* limit, const uint8_t* m, int64_t n,
                                               const double* mean, double* sums, const scalar_t* next) {
  if (fills_nibbles(m, n))
    nibble_squares(x, limit, m, n, mean, sums, next);
  else
    portable_squares(x, limit, m, n, mean, sums, next);
}
#endif

