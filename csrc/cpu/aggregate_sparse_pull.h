// The AVX-512 build of the sparse CPU kernel (index sets and masks): one memory pass, 64 columns at a time, the sums
// in registers. No include guard on purpose: aggregate_cpu.cpp includes it once, inside namespace `avx512`, after
// aggregate_tile.h and aggregate_sparse_kernel.h (bits16, bits64, limit_of), with HASFL_SPARSE_TARGET set to the AVX-512
// target attribute. It must include nothing itself.
//
// The result is bit for bit that of this build's earlier forms (which listed each entry's held words, expanded them
// into a tile buffer and kept them for a second pass): per column, acc = w x + acc (one fused multiply-add, x
// expanded into the 16 lanes of a word holding any value, so lanes of clear bits add w x 0) and den += w on the set
// bits, over the covering entries in entry order; mean = acc / den (0 where den is 0); per entry and item (row x
// tile of <= kCpuTile columns), the masked (x - mean)^2 and mean^2 in 16 lanes (column mod 16), each lane a chain
// of fused multiply-adds in column order, the lanes combined in a fixed tree at the item's end. Only the loop nest
// differs: per item, for each 64 columns (4 words of 16) of the tile,
//   1. for each covering entry in order, its 64 bits and the values they hold (a plain 64-byte load and vexpandps per
//      word; where all the parameter's words are runs from their first column, one load masked by the bits), added to 8 vectors of weighted sums and 8 of covering weights held in registers; the only stores are
//      the expanded words, kept for step 3 (64 values an entry as they came, floats or doubles, L1); meanwhile the
//      entry's own run 4 cache lines ahead is prefetched (it is read from L2 otherwise) and the matching part of the
//      entry's next item (its packed run continues there when the item is not a row's last tile; at a
//      row's last tile the next row's entries are looked up and their first runs prefetched instead);
//   2. the 64 columns' mean from the registers, written to the output once (the matching 64 columns of the next
//      item's output prefetched for writing);
//   3. for each entry again, its kept words (float32: converted to doubles again) into its 16 + 16 norm lanes (kept in
//      PullEntry, L1, loaded and stored once per 64 columns).
// A word none of an entry's bits is set in is a no-op for its sums, as when the earlier forms skipped it: the
// covering weights' and the norms' updates are masked by the bits; the weighted sum's needs no mask, because acc
// starts at +0 and a fused multiply-add gives -0 only from w x = -0 and acc = -0, so acc is never -0, and
// w x (+0) + acc (w finite and > 0, checked on the host) is then acc itself, bit for bit (NaN and infinities
// included). The entries' state lives in PullEntry (aggregate_cpu.cpp), one 64-byte-aligned record of 320 bytes each.

// Doubles of room one kept word takes: its 16 expanded values as they came (float32: 8 doubles' room; float64: 16).
// Float32 words are kept as floats so the kept buffer (max_entries x 64 values, with PullEntry the kernel's L1 working
// set) is half the size: 50 entries' 12.8 KB instead of 25.6; step 3 converts them again (exact), which costs less
// than the L1 misses the larger buffer caused (masks -6 %, one thread).
template <typename scalar_t>
constexpr int64_t kKeptWord = sizeof(scalar_t) == 4 ? 8 : 16;

// The 16 columns of one word of an entry as doubles (lo: lanes 0-7, hi: 8-15), its next values x expanded into the
// bits' lanes (+0 elsewhere), and kept (kKeptWord) for step 3. kChecked: read at most up to `limit` (the entry's
// end; a masked load), else a plain 64-byte load (the caller checked that 80 values lie ahead). The empty asm keeps
// the loaded values in a register: GCC would otherwise fold the load into vexpandps's memory form, an expand-load,
// which is microcoded on this Zen (about 4 ns a word against 1.2 for load and register expand, L1-resident).
template <typename scalar_t, bool kChecked, bool kRuns>
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline void word_values(const scalar_t* x, const scalar_t* limit,
                                                                           unsigned bits, __m512d* lo, __m512d* hi,
                                                                           double* kept) {
  const int count = __builtin_popcount(bits);
  if constexpr (kRuns) {
    // The word's set bits are its first `count` columns: a load masked by them is the expanded word (+0 elsewhere),
    // and reads nothing past them.
    if constexpr (sizeof(scalar_t) == 4) {
      const __m512 e = _mm512_maskz_loadu_ps(static_cast<__mmask16>(bits), x);
      *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
      *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
      _mm512_store_ps(reinterpret_cast<float*>(kept), e);
    } else {
      *lo = _mm512_maskz_loadu_pd(static_cast<__mmask8>(bits & 0xFFu), x);
      *hi = _mm512_maskz_loadu_pd(static_cast<__mmask8>(bits >> 8), x + 8);
      _mm512_store_pd(kept, *lo);
      _mm512_store_pd(kept + 8, *hi);
    }
    (void)limit;
    (void)count;
  } else if constexpr (sizeof(scalar_t) == 4) {
    const __mmask16 first_count = static_cast<__mmask16>((1u << count) - 1u);
    __m512 v = !kChecked || limit - x >= 16 ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(first_count, x);
    __asm__("" : "+v"(v));  // a register for vexpandps: its memory form is microcoded here, ~4x slower
    const __m512 e = _mm512_maskz_expand_ps(static_cast<__mmask16>(bits), v);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    _mm512_store_ps(reinterpret_cast<float*>(kept), e);  // (8 doubles' room: 16 floats)
  } else {
    const int first = __builtin_popcount(bits & 0xFFu);  // values of the low 8 lanes
    __m512d a = !kChecked || limit - x >= 8 ? _mm512_loadu_pd(x)
                                            : _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << first) - 1u), x);
    __m512d b = !kChecked || limit - (x + first) >= 8
                    ? _mm512_loadu_pd(x + first)
                    : _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << (count - first)) - 1u), x + first);
    __asm__("" : "+v"(a), "+v"(b));
    *lo = _mm512_maskz_expand_pd(static_cast<__mmask8>(bits & 0xFFu), a);
    *hi = _mm512_maskz_expand_pd(static_cast<__mmask8>(bits >> 8), b);
    _mm512_store_pd(kept, *lo);
    _mm512_store_pd(kept + 8, *hi);
  }
}

// Step 1 for one entry: its values in 64 columns (quad: their bits; x: its first value there) added to the
// registers, acc[v] = w x + acc[v] (x = +0 in clear lanes: a no-op, see the top), den[v] += w on the set bits
// (v: 8 columns), and kept expanded (kKeptWord a word) for step 3. Meanwhile it prefetches, `ahead` values
// past each word's, the part of the entry's next item that matches (where its next run starts minus where this one
// does; a prefetch past the next run reads the run after it, and faults never), and 4 cache lines past each word's
// own values (the next 64 columns' of this item, or the next item's: one thread, index sets -11 %, masks +-0).
template <typename scalar_t, bool kChecked, bool kRuns>
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline void pull_sums(const scalar_t* x, const scalar_t* limit,
                                                                         uint64_t quad, __m512d wv, __m512d* acc,
                                                                         __m512d* den, double* kept,
                                                                         std::ptrdiff_t ahead) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const unsigned bits = static_cast<unsigned>(quad >> (16 * t)) & 0xFFFFu;
    __builtin_prefetch(x + ahead);
    if (sizeof(scalar_t) == 8) __builtin_prefetch(x + ahead + kLine);
    __builtin_prefetch(x + 4 * kLine);
    __m512d lo, hi;
    word_values<scalar_t, kChecked, kRuns>(x, limit, bits, &lo, &hi, kept + kKeptWord<scalar_t> * t);
    x += __builtin_popcount(bits);
    acc[2 * t] = _mm512_fmadd_pd(wv, lo, acc[2 * t]);
    acc[2 * t + 1] = _mm512_fmadd_pd(wv, hi, acc[2 * t + 1]);
    den[2 * t] = _mm512_mask_add_pd(den[2 * t], static_cast<__mmask8>(bits & 0xFFu), den[2 * t], wv);
    den[2 * t + 1] = _mm512_mask_add_pd(den[2 * t + 1], static_cast<__mmask8>(bits >> 8), den[2 * t + 1], wv);
  }
}

// Step 3 for one entry: its lanes (a: (x - mean)^2, b: mean^2, low and high 8 columns of a word) over the set bits
// of 64 columns (quad), in column order, from the words step 1 kept.
template <typename scalar_t>
HASFL_SPARSE_TARGET __attribute__((always_inline)) inline void pull_squares(uint64_t quad, const double* kept,
                                                                            const __m512d* mean, double* lanes) {
  __m512d a0 = _mm512_load_pd(lanes), a1 = _mm512_load_pd(lanes + 8);
  __m512d b0 = _mm512_load_pd(lanes + 16), b1 = _mm512_load_pd(lanes + 24);
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const unsigned bits = static_cast<unsigned>(quad >> (16 * t)) & 0xFFFFu;
    __m512d lo, hi;
    if constexpr (sizeof(scalar_t) == 4) {
      const __m512 e = _mm512_load_ps(reinterpret_cast<const float*>(kept + 8 * t));
      lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
      hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    } else {
      lo = _mm512_load_pd(kept + 16 * t);
      hi = _mm512_load_pd(kept + 16 * t + 8);
    }
    const __mmask8 mlo = static_cast<__mmask8>(bits & 0xFFu), mhi = static_cast<__mmask8>(bits >> 8);
    const __m512d m0 = mean[2 * t], m1 = mean[2 * t + 1];
    const __m512d d0 = _mm512_sub_pd(lo, m0), d1 = _mm512_sub_pd(hi, m1);
    a0 = _mm512_mask3_fmadd_pd(d0, d0, a0, mlo);
    a1 = _mm512_mask3_fmadd_pd(d1, d1, a1, mhi);
    b0 = _mm512_mask3_fmadd_pd(m0, m0, b0, mlo);
    b1 = _mm512_mask3_fmadd_pd(m1, m1, b1, mhi);
  }
  _mm512_store_pd(lanes, a0);
  _mm512_store_pd(lanes + 8, a1);
  _mm512_store_pd(lanes + 16, b0);
  _mm512_store_pd(lanes + 24, b1);
}

// The 16 lanes of lo (lanes 0-7) and hi (8-15) summed in the portable build's fixed tree (lane l += lane l + width
// for width 8, 4, 2, 1): each vector add is those scalar adds, lane for lane.
HASFL_SPARSE_TARGET inline double tree16(__m512d lo, __m512d hi) {
  const __m512d s8 = _mm512_add_pd(lo, hi);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

template <typename scalar_t, bool kRuns>
HASFL_SPARSE_TARGET void run_sparse_chunk_words(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                                const SparseScratch& s) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  const ChunkView v(args.params, args.chunks, chunk, kCpuTile);
  const int64_t ndim = v.ndim, length = v.length, tiles = v.tiles, entry_begin = v.entry_begin;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  scalar_t* out = v.output<scalar_t>(args.out);
  const auto local_of = [&sp, &v](int64_t e, const int64_t* entry, int64_t row) {
    return sparse_local_row(sp, v.param, e, entry, row);
  };
  PullEntry* pull = s.pull;
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
      row_count = enter_row<scalar_t>(v, args, sp, s, row, pull);
    }
    if (row_count == 0) {
      write_tile_zeros(out_tile, n);
      continue;
    }
    // At a row's last tile, the next item is the next row's first tile: its entries (an index set's rows are a
    // random subset of each client's, so they are not this row's) and their runs there, prefetched a part at each
    // 64 columns of this tile. Elsewhere the next item is the next tile of this row, each entry's run continuing.
    const int64_t steps = ceil_div(n, 64);
    const bool row_end = tile + 1 == tiles;
    int64_t next_count = 0;
    if (row_end && item + 1 < v.item_end) {
      next_count = v.collect_row<false>(args.entries, row + 1, s.next_entry, s.next_start, local_of);
      for (int64_t k = 0; k < next_count; ++k) {
        const int64_t e = s.next_entry[k];
        const int64_t len = tiles > 1 ? sp.tile_prefix[sp.prefix_begin[e] + 1]
                                      : args.entries[e * kEntryCols + kEntryPacked + ndim - 1];
        s.next_lines[k] = ceil_div(ceil_div(len, kLine), steps);
        __builtin_prefetch(sp.bits[e]);
      }
    }
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* prefix = sp.tile_prefix + sp.prefix_begin[e];  // (tile + 1 < tiles where it is read)
      const scalar_t* row_x = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k];
      PullEntry& entry = pull[k];
      entry.run = entry.at = row_x + prefix[tile];
      entry.bits = sp.bits[e] + c0 / 8;
      // Not at a row's end, the next item reads this entry's run from where this tile's ends, and the bits there.
      if (row_end) {
        entry.ahead = 0;  // (step 1 prefetches its own run: a no-op)
      } else {
        entry.ahead = prefix[tile + 1] - prefix[tile];
        __builtin_prefetch(sp.bits[e] + (c0 + kCpuTile) / 8);
        __builtin_prefetch(sp.bits[e] + (c0 + kCpuTile) / 8 + 64);
      }
      for (int l = 0; l < 32; l += 8) _mm512_store_pd(entry.lanes + l, _mm512_setzero_pd());
    }
    for (int64_t j = 0; j < n; j += 64) {
      for (int64_t k = 0; k < next_count; ++k) {
        const scalar_t* run = static_cast<const scalar_t*>(args.data[s.next_entry[k]]) + s.next_start[k];
        const int64_t lines = s.next_lines[k], first = j / 64 * lines;
        for (int64_t l = first; l < first + lines; ++l) __builtin_prefetch(run + l * kLine);
      }
      // The next item's output starts where this one's ends (the output is row-major and items follow it): its
      // lines are fetched for writing now, so step 2's stores there do not wait on memory (past the end: no fault).
      for (int64_t l = 0; l < 64; l += kLine) __builtin_prefetch(out_tile + n + j + l, 1);
      __m512d acc[8], den[8];
      for (int i = 0; i < 8; ++i) acc[i] = den[i] = _mm512_setzero_pd();
      for (int64_t k = 0; k < row_count; ++k) {
        PullEntry& entry = pull[k];
        const uint64_t quad = bits64(entry.bits, j, n);
        entry.quad = quad;
        if (quad == 0) continue;
        const scalar_t* x = static_cast<const scalar_t*>(entry.at);
        const scalar_t* limit = static_cast<const scalar_t*>(entry.limit);
        const __m512d wv = _mm512_set1_pd(entry.weight);
        double* kept = s.kept + 4 * kKeptWord<scalar_t> * k;
        if (kRuns || limit - x >= 80)
          pull_sums<scalar_t, false, kRuns>(x, limit, quad, wv, acc, den, kept, entry.ahead);
        else
          pull_sums<scalar_t, true, kRuns>(x, limit, quad, wv, acc, den, kept, entry.ahead);
        entry.at = x + __builtin_popcountll(quad);
      }
      __m512d mean[8];
      for (int i = 0; i < 8; ++i) {
        const __mmask8 any = _mm512_cmp_pd_mask(den[i], _mm512_setzero_pd(), _CMP_GT_OQ);
        mean[i] = _mm512_maskz_div_pd(any, acc[i], den[i]);  // a NaN as kCanonicalNan, as write_tile_mean's
        mean[i] = _mm512_mask_mov_pd(mean[i], _mm512_cmp_pd_mask(mean[i], mean[i], _CMP_UNORD_Q),
                                     _mm512_set1_pd(kCanonicalNan));
        const int64_t rest = n - j - 8 * i;
        if (rest <= 0) continue;
        const __mmask8 inside = rest >= 8 ? static_cast<__mmask8>(0xFFu) : static_cast<__mmask8>((1u << rest) - 1u);
        if constexpr (sizeof(scalar_t) == 4)
          _mm256_mask_storeu_ps(reinterpret_cast<float*>(out_tile) + j + 8 * i, inside, _mm512_cvtpd_ps(mean[i]));
        else
          _mm512_mask_storeu_pd(reinterpret_cast<double*>(out_tile) + j + 8 * i, inside, mean[i]);
        covered += __builtin_popcount(static_cast<unsigned>(any & inside));
      }
      for (int64_t k = 0; k < row_count; ++k) {
        PullEntry& entry = pull[k];
        const uint64_t quad = entry.quad;
        if (quad == 0) continue;
        pull_squares<scalar_t>(quad, s.kept + 4 * kKeptWord<scalar_t> * k, mean, entry.lanes);
      }
    }
    for (int64_t k = 0; k < row_count; ++k) {
      const double* lanes = pull[k].lanes;
      double sums[2] = {0.0, 0.0};
      sums[0] += tree16(_mm512_load_pd(lanes), _mm512_load_pd(lanes + 8));
      sums[1] += tree16(_mm512_load_pd(lanes + 16), _mm512_load_pd(lanes + 24));
      part_num[s.row_entry[k] - entry_begin] += sums[0];
      part_den[s.row_entry[k] - entry_begin] += sums[1];
    }
  }
  args.chunk_covered[chunk] = covered;
}


// A chunk of a parameter whose entries' words are all runs from the word's first column (sp.runs: a channel index
// set over runs of 16 columns, or 0/16 bits a word) loads each word masked instead of expanding it: the same values.
template <typename scalar_t>
HASFL_SPARSE_TARGET void run_sparse_chunk(const CpuArgs& args, const SparseArgs& sp, int64_t chunk,
                                          const SparseScratch& s) {
  if (sp.runs != nullptr && sp.runs[args.chunks[chunk * kChunkCols + kChunkParam]])
    run_sparse_chunk_words<scalar_t, true>(args, sp, chunk, s);
  else
    run_sparse_chunk_words<scalar_t, false>(args, sp, chunk, s);
}
