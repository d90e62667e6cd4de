// The per-chunk CPU kernel of the fused aggregation. No include guard on purpose: aggregate_cpu.cpp
// includes this file twice, inside namespaces `avx2` and `generic`, with HASFL_CPU_TARGET set to a
// target attribute or to nothing, so one source yields an AVX2+FMA build and a portable one.
// It must include nothing itself (headers would be compiled under the target attribute too).
//
// Per item (one row, one tile of <= kCpuTile columns of the last dim):
//   1. the entries covering the row (cached per row; nested parameters stop at the first miss),
//   2. pass 1: acc[c] = sum of w_e * x_e[c] over the covering entries' windows,
//   3. mean[c] = acc[c] / (sum of the covering weights), or 0 where no entry covers c; written to out,
//   4. pass 2 (re-reads the same tile of each entry, now in L2): sum (x_e[c] - mean[c])^2 per entry,
//      and sum mean[c]^2 over each entry's covered columns; meanwhile it prefetches what pass 1 of the
//      next item reads, so memory keeps streaming while the core computes.
// Everything is accumulated in double; partials go to this chunk's own slots.
//
// Nested parameters (all windows share their offset, widths non-increasing) need no per-column
// bookkeeping: entry 0's window holds every covered column, and the columns covered by exactly the
// first k row entries form the window of offset (o + w_k) mod L and width w_{k-1} - w_k. When their
// windows meet the tile in one run from its first column (leading slices), passes 1 and 2 take the
// entries 4 at a time over the sub-ranges that 1, 2, 3 or 4 of them cover. Other parameters accumulate
// the covering weight per column and take the entries one at a time.

struct Scratch {
  double* acc;   // kCpuTile
  double* den;   // kCpuTile: covering weight per column (not nested)
  double* mean;  // kCpuTile
  double* square_by_count;  // max_entries + 1 (nested): sum of mean^2 over columns covered by exactly k
  int64_t* row_entry;       // max_entries: entries covering the current row
  int64_t* row_start;       // max_entries: element offset of that row inside the entry's packed tensor
  const void** x_start;     // max_entries (nested): where the current tile's run of row entry k starts
  int64_t* x_len;           // max_entries (nested): its length (non-increasing in k)
};

// Four doubles (one AVX2 register; two SSE2 registers in the portable build) via GCC vector extensions.
typedef double Double4 __attribute__((vector_size(32)));
typedef float Float4 __attribute__((vector_size(16)));

#if HASFL_CPU_AVX2
// One vcvtps2pd from memory (GCC lowers __builtin_convertvector to two 128-bit halves plus an insert).
HASFL_CPU_TARGET inline Double4 load_double4(const float* x) { return (Double4)_mm256_cvtps_pd(_mm_loadu_ps(x)); }
#else
HASFL_CPU_TARGET inline Double4 load_double4(const float* x) {
  Float4 v;
  __builtin_memcpy(&v, x, sizeof(v));
  return __builtin_convertvector(v, Double4);
}
#endif

HASFL_CPU_TARGET inline Double4 load_double4(const double* x) {
  Double4 v;
  __builtin_memcpy(&v, x, sizeof(v));
  return v;
}

HASFL_CPU_TARGET inline void store_double4(double* to, const Double4& v) { __builtin_memcpy(to, &v, sizeof(v)); }

// acc[j] = (acc[j] +) w[0] x[0][j] + ... + w[N-1] x[N-1][j] for j in [begin, end): N entries per pass over
// acc (a quarter of the accumulator traffic of one entry at a time), added in entry order.
template <typename scalar_t, int N, bool kAssign>
HASFL_CPU_TARGET inline void accumulate_group(double* acc, const scalar_t* const* x, const double* w, int64_t begin,
                                              int64_t end) {
  int64_t j = begin;
  for (; j + 4 <= end; j += 4) {
    Double4 sum = kAssign ? w[0] * load_double4(x[0] + j) : load_double4(acc + j) + w[0] * load_double4(x[0] + j);
    for (int n = 1; n < N; ++n) sum += w[n] * load_double4(x[n] + j);
    store_double4(acc + j, sum);
  }
  for (; j < end; ++j) {
    double sum = kAssign ? w[0] * static_cast<double>(x[0][j]) : acc[j] + w[0] * static_cast<double>(x[0][j]);
    for (int n = 1; n < N; ++n) sum += w[n] * static_cast<double>(x[n][j]);
    acc[j] = sum;
  }
}

// For N entries at once (one load of the mean for all): sums[n] += sum of (x[n][j] - mean[j])^2 over
// j in [begin, end), a vector accumulator per entry (N independent FMA chains). Meanwhile it prefetches
// next[n][begin, end), what pass 1 of the next item reads: this pass computes, so memory would idle.
// (The hardware prefetchers give up on dozens of interleaved streams that cross a page every 4 KiB.)
template <typename scalar_t, int N>
HASFL_CPU_TARGET inline void squares_group(const scalar_t* const* x, const scalar_t* const* next, const double* mean,
                                           int64_t begin, int64_t end, double* sums) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  Double4 a[N];
  double tail[N];
  for (int n = 0; n < N; ++n) {
    a[n] = Double4{0, 0, 0, 0};
    tail[n] = 0.0;
  }
  int64_t j = begin;
  for (; j + 4 <= end; j += 4) {
    if (j % kLine < 4)
      for (int n = 0; n < N; ++n) __builtin_prefetch(next[n] + j);
    const Double4 m = load_double4(mean + j);
    for (int n = 0; n < N; ++n) {
      const Double4 d = load_double4(x[n] + j) - m;
      a[n] += d * d;
    }
  }
  for (; j < end; ++j)
    for (int n = 0; n < N; ++n) {
      const double d = static_cast<double>(x[n][j]) - mean[j];
      tail[n] += d * d;
    }
  for (int n = 0; n < N; ++n) sums[n] += ((a[n][0] + a[n][1]) + (a[n][2] + a[n][3])) + tail[n];
}

// Sum of (x[j] - mean[j])^2 over j < len. One accumulator would make the loop wait on the FMA latency
// for every vector; four (16 lanes), combined in a fixed order, do not. While this compute-bound pass
// runs, the memory system would idle: it prefetches `fetch[0, len)`, what pass 1 of the next item reads.
// (The hardware prefetchers give up on dozens of interleaved streams that cross a page every 4 KiB.)
template <typename scalar_t>
HASFL_CPU_TARGET inline double sum_squared_diff(const scalar_t* x, const double* mean, int64_t len,
                                                 const scalar_t* fetch) {
  Double4 a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    __builtin_prefetch(fetch + j);
    if (sizeof(scalar_t) == 8) __builtin_prefetch(fetch + j + 8);
    const Double4 d0 = load_double4(x + j) - load_double4(mean + j);
    const Double4 d1 = load_double4(x + j + 4) - load_double4(mean + j + 4);
    const Double4 d2 = load_double4(x + j + 8) - load_double4(mean + j + 8);
    const Double4 d3 = load_double4(x + j + 12) - load_double4(mean + j + 12);
    a0 += d0 * d0;
    a1 += d1 * d1;
    a2 += d2 * d2;
    a3 += d3 * d3;
  }
  double tail = 0.0;
  for (; j < len; ++j) {
    const double d = static_cast<double>(x[j]) - mean[j];
    tail += d * d;
  }
  const Double4 a = (a0 + a1) + (a2 + a3);
  return ((a[0] + a[1]) + (a[2] + a[3])) + tail;
}

// mean[j] = acc[j] * inverse (kCanonicalNan where that is a NaN), out[j] = mean[j] rounded to scalar_t; returns the
// sum of mean[j]^2.
template <typename scalar_t>
HASFL_CPU_TARGET inline double write_mean(const double* acc, double inverse, int64_t len, double* mean,
                                          scalar_t* out) {
  Double4 a0 = {0, 0, 0, 0}, a1 = a0;
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    Double4 m0, m1;
    __builtin_memcpy(&m0, acc + j, sizeof(m0));
    __builtin_memcpy(&m1, acc + j + 4, sizeof(m1));
    m0 *= inverse;
    m1 *= inverse;
    m0 = m0 == m0 ? m0 : kCanonicalNan;  // a NaN as write_tile_mean writes it
    m1 = m1 == m1 ? m1 : kCanonicalNan;
    __builtin_memcpy(mean + j, &m0, sizeof(m0));
    __builtin_memcpy(mean + j + 4, &m1, sizeof(m1));
    for (int l = 0; l < 4; ++l) {
      out[j + l] = static_cast<scalar_t>(m0[l]);
      out[j + 4 + l] = static_cast<scalar_t>(m1[l]);
    }
    a0 += m0 * m0;
    a1 += m1 * m1;
  }
  double tail = 0.0;
  for (; j < len; ++j) {
    const double q = acc[j] * inverse;
    const double m = q != q ? kCanonicalNan : q;
    mean[j] = m;
    out[j] = static_cast<scalar_t>(m);
    tail += m * m;
  }
  const Double4 a = a0 + a1;
  return ((a[0] + a[1]) + (a[2] + a[3])) + tail;
}

template <typename scalar_t>
HASFL_CPU_TARGET inline void accumulate_some(bool assign, int count, double* acc, const scalar_t* const* x,
                                             const double* w, int64_t begin, int64_t end) {
  switch (count * 2 + (assign ? 1 : 0)) {
    case 2: return accumulate_group<scalar_t, 1, false>(acc, x, w, begin, end);
    case 3: return accumulate_group<scalar_t, 1, true>(acc, x, w, begin, end);
    case 4: return accumulate_group<scalar_t, 2, false>(acc, x, w, begin, end);
    case 5: return accumulate_group<scalar_t, 2, true>(acc, x, w, begin, end);
    case 6: return accumulate_group<scalar_t, 3, false>(acc, x, w, begin, end);
    case 7: return accumulate_group<scalar_t, 3, true>(acc, x, w, begin, end);
    case 8: return accumulate_group<scalar_t, 4, false>(acc, x, w, begin, end);
    default: return accumulate_group<scalar_t, 4, true>(acc, x, w, begin, end);
  }
}

template <typename scalar_t>
HASFL_CPU_TARGET inline void squares_some(int count, const scalar_t* const* x, const scalar_t* const* next,
                                          const double* mean, int64_t begin, int64_t end, double* sums) {
  switch (count) {
    case 1: return squares_group<scalar_t, 1>(x, next, mean, begin, end, sums);
    case 2: return squares_group<scalar_t, 2>(x, next, mean, begin, end, sums);
    case 3: return squares_group<scalar_t, 3>(x, next, mean, begin, end, sums);
    default: return squares_group<scalar_t, 4>(x, next, mean, begin, end, sums);
  }
}

template <typename scalar_t, bool kNested>
HASFL_CPU_TARGET void run_chunk(const CpuArgs& args, int64_t chunk, const Scratch& s) {
  const ChunkView v(args.params, args.chunks, chunk, kCpuTile);
  const int64_t ndim = v.ndim, length = v.length, entry_begin = v.entry_begin;
  const double* weight_prefix = args.weight_prefix + entry_begin + v.p;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  scalar_t* out = v.output<scalar_t>(args.out);
  int64_t covered = 0;
  int64_t current_row = -1;
  int64_t row_count = 0;

  for (int64_t item = v.item_begin; item < v.item_end; ++item) {
    const int64_t row = v.row_of(item);
    const int64_t c0 = v.first_column(item);
    const int64_t c1 = v.end_column(item);
    const int64_t n = c1 - c0;
    scalar_t* out_tile = out + row * length + c0;
    if (row != current_row) {
      current_row = row;
      row_count = v.collect_dense_row<kNested>(args.entries, row, s.row_entry, s.row_start);
    }
    if (row_count == 0) {
      write_tile_zeros(out_tile, n);
      continue;
    }

    // Nested windows that meet the tile in one run from its first column (no wrap-around inside the tile:
    // every leading slice) are handled 4 entries at a time. Row entry k's run is [0, x_len[k]), and
    // entries k..k+m-1 (not k+m) cover [x_len[k+m], x_len[k+m-1]).
    int64_t active = 0;
    bool runs = kNested;
    if (kNested) {
      for (int64_t k = 0; k < row_count; ++k) {
        const int64_t* entry = args.entries + s.row_entry[k] * kEntryCols;
        Piece pieces[2];
        const int count = window_pieces(entry[kEntryOffset + ndim - 1], entry[kEntryPacked + ndim - 1], length, c0,
                                        c1, pieces);
        if (count == 0) break;  // later windows lie inside this one
        if (count > 1 || pieces[0].begin != c0) {
          runs = false;
          break;
        }
        s.x_start[k] = static_cast<const scalar_t*>(args.data[s.row_entry[k]]) + s.row_start[k] + pieces[0].local;
        s.x_len[k] = pieces[0].end - c0;
        active = k + 1;
      }
    }
    const scalar_t* group_x[4];
    const scalar_t* group_next[4];
    double group_w[4];

    // Pass 1: weighted sums (nested: entry 0 covers every covered column, so it assigns).
    if (runs) {
      for (int64_t k = 0; k < active; k += 4) {
        const int count = static_cast<int>(min64(4, active - k));
        for (int i = 0; i < count; ++i) {
          group_x[i] = static_cast<const scalar_t*>(s.x_start[k + i]);
          group_w[i] = args.entry_weight[s.row_entry[k + i]];
        }
        for (int m = count; m >= 1; --m) {
          const int64_t begin = m == count ? 0 : s.x_len[k + m], end = s.x_len[k + m - 1];
          if (begin < end) accumulate_some(k == 0, m, s.acc, group_x, group_w, begin, end);
        }
      }
    }
    if (!kNested) clear_tile_sums(s.acc, s.den, n);
    for (int64_t k = 0; k < row_count && !runs; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* entry = args.entries + e * kEntryCols;
      const double w = args.entry_weight[e];
      const scalar_t* x_row = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k];
      Piece pieces[2];
      const int count = window_pieces(entry[kEntryOffset + ndim - 1], entry[kEntryPacked + ndim - 1], length, c0,
                                      c1, pieces);
      for (int i = 0; i < count; ++i) {
        const int64_t b = pieces[i].begin - c0, len = pieces[i].end - pieces[i].begin;
        const scalar_t* x = x_row + pieces[i].local;
        double* acc = s.acc + b;
        if (kNested && k == 0) {
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) acc[j] = w * static_cast<double>(x[j]);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) acc[j] += w * static_cast<double>(x[j]);
        }
        if (!kNested) {
          double* den = s.den + b;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) den[j] += w;
        }
      }
    }

    // Mean over exactly the covering entries; 0 where none covers.
    if (kNested) {
      const int64_t* first = args.entries + s.row_entry[0] * kEntryCols;
      const int64_t offset = first[kEntryOffset + ndim - 1];
      Piece pieces[2];
      int64_t width_above = first[kEntryPacked + ndim - 1];  // w_{k-1}
      int count = window_pieces((offset + width_above) % length, length - width_above, length, c0, c1, pieces);
      for (int i = 0; i < count; ++i)
        for (int64_t j = pieces[i].begin - c0; j < pieces[i].end - c0; ++j) out_tile[j] = scalar_t(0);
      for (int64_t k = 1; k <= row_count; ++k) {
        const int64_t width = k < row_count ? args.entries[s.row_entry[k] * kEntryCols + kEntryPacked + ndim - 1] : 0;
        const double inverse = 1.0 / weight_prefix[k];
        double sum = 0.0;
        count = window_pieces((offset + width) % length, width_above - width, length, c0, c1, pieces);
        for (int i = 0; i < count; ++i) {
          const int64_t b = pieces[i].begin - c0, len = pieces[i].end - pieces[i].begin;
          sum += write_mean(s.acc + b, inverse, len, s.mean + b, out_tile + b);
          covered += len;
        }
        s.square_by_count[k] = sum;
        width_above = width;
      }
      // Entry k covers exactly the columns covered by more than k entries.
      double suffix = 0.0;
      for (int64_t k = row_count - 1; k >= 0; --k) {
        suffix += s.square_by_count[k + 1];
        part_den[s.row_entry[k] - entry_begin] += suffix;
      }
    } else {
      covered += write_tile_mean(s.acc, s.den, n, s.mean, out_tile);
    }

    // Pass 2: ||m_e (x_e - mean)||^2 (and ||m_e mean||^2 when not nested).
    if (runs) {
      for (int64_t k = 0; k < active; k += 4) {
        const int count = static_cast<int>(min64(4, active - k));
        double sums[4] = {0.0, 0.0, 0.0, 0.0};
        for (int i = 0; i < count; ++i) {
          group_x[i] = static_cast<const scalar_t*>(s.x_start[k + i]);
          group_next[i] = group_x[i] + s.x_len[k + i];  // the entry's next tile, or next row, follows
        }
        for (int m = count; m >= 1; --m) {
          const int64_t begin = m == count ? 0 : s.x_len[k + m], end = s.x_len[k + m - 1];
          if (begin < end) squares_some(m, group_x, group_next, s.mean, begin, end, sums);
        }
        for (int i = 0; i < count; ++i) part_num[s.row_entry[k + i] - entry_begin] += sums[i];
      }
    }
    for (int64_t k = 0; k < row_count && !runs; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* entry = args.entries + e * kEntryCols;
      const scalar_t* x_row = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k];
      Piece pieces[2];
      const int count = window_pieces(entry[kEntryOffset + ndim - 1], entry[kEntryPacked + ndim - 1], length, c0,
                                      c1, pieces);
      // This entry's next reads (next tile, or next row) follow its current ones in memory.
      const scalar_t* next = count ? x_row + pieces[count - 1].local + (pieces[count - 1].end - pieces[count - 1].begin)
                                   : x_row;
      double sum_diff = 0.0, sum_mean = 0.0;
      for (int i = 0; i < count; ++i) {
        const int64_t b = pieces[i].begin - c0, len = pieces[i].end - pieces[i].begin;
        const scalar_t* x = x_row + pieces[i].local;
        const double* mean = s.mean + b;
        sum_diff += sum_squared_diff(x, mean, len, next + (pieces[i].begin - pieces[0].begin));
        if (!kNested) {
#pragma omp simd reduction(+ : sum_mean)
          for (int64_t j = 0; j < len; ++j) sum_mean += mean[j] * mean[j];
        }
      }
      part_num[e - entry_begin] += sum_diff;
      if (!kNested) part_den[e - entry_begin] += sum_mean;
    }
  }
  args.chunk_covered[chunk] = covered;
}
