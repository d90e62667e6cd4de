// The per-chunk CPU kernel of the fused aggregation. No include guard on purpose: aggregate_cpu.cpp
// includes this file twice, inside namespaces `avx2` and `generic`, with HASFL_CPU_TARGET set to a
// target attribute or to nothing, so one source yields an AVX2+FMA build and a portable one.
// It must include nothing itself (headers would be compiled under the target attribute too).
//
// Per item (one row, one tile of <= kCpuTile columns of the last dim):
//   1. the entries covering the row (cached per row; nested parameters stop at the first miss),
//   2. pass 1: acc[c] += w_e * x_e[c] over the covering entries' windows, plus a coverage count per column,
//   3. mean[c] = acc[c] / (sum of the covering weights), or 0 where no entry covers c; written to out,
//   4. pass 2 (re-reads the same tile of each entry from L1/L2): sum (x_e[c] - mean[c])^2 per entry and
//      sum mean[c]^2 over each entry's covered columns.
// Everything is accumulated in double; partials go to this chunk's own slots.

struct Scratch {
  double* acc;        // kCpuTile
  double* den;        // kCpuTile: covering weight per column
  double* mean;       // kCpuTile
  int64_t* count;     // kCpuTile + 1: difference array, then covering entries per column
  double* square_by_count;  // max_entries + 1 (nested only)
  int64_t* row_entry;       // max_entries: entries covering the current row
  int64_t* row_start;       // max_entries: element offset of that row inside the entry's packed tensor
};

template <typename scalar_t, bool kNested>
HASFL_CPU_TARGET void run_chunk(const CpuArgs& args, int64_t chunk, const Scratch& s) {
  const int64_t* chunk_row = args.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = args.params + p * kParamCols;
  const int64_t ndim = param[kParamNdim];
  const int64_t length = row_length(param);
  const int64_t tiles = tiles_per_row(param, kCpuTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  const double* weight_prefix = args.weight_prefix + entry_begin + p;
  double* part_num = args.partial_num + chunk_row[kChunkPartialBase];
  double* part_den = args.partial_den + chunk_row[kChunkPartialBase];
  scalar_t* out = static_cast<scalar_t*>(args.out) + param[kParamOutOffset];
  int64_t covered = 0;
  int64_t current_row = -1;
  int64_t row_count = 0;

  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles;
    const int64_t c0 = (item % tiles) * kCpuTile;
    const int64_t c1 = min64(c0 + kCpuTile, length);
    const int64_t n = c1 - c0;
    if (row != current_row) {
      current_row = row;
      row_count = 0;
      for (int64_t e = entry_begin; e < entry_end; ++e) {
        const int64_t* entry = args.entries + e * kEntryCols;
        const int64_t local = local_row(param, entry, row);
        if (local < 0) {
          if (kNested) break;
          continue;
        }
        s.row_entry[row_count] = e;
        s.row_start[row_count] = local * entry[kEntryPacked + ndim - 1];
        ++row_count;
      }
    }

    // Pass 1: weighted sums and coverage counts.
    for (int64_t j = 0; j < n; ++j) s.acc[j] = 0.0;
    for (int64_t j = 0; j <= n; ++j) s.count[j] = 0;
    if (!kNested)
      for (int64_t j = 0; j < n; ++j) s.den[j] = 0.0;
    for (int64_t k = 0; k < row_count; ++k) {
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
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) acc[j] += w * static_cast<double>(x[j]);
        if (!kNested) {
          double* den = s.den + b;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) den[j] += w;
        }
        ++s.count[b];
        --s.count[b + len];
      }
    }

    // Mean over exactly the covering entries; 0 where none covers.
    int64_t running = 0;
    for (int64_t j = 0; j < n; ++j) {
      running += s.count[j];
      s.count[j] = running;
      covered += running > 0;
      if (kNested) s.den[j] = weight_prefix[running];
    }
    scalar_t* out_tile = out + row * length + c0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const double m = s.count[j] > 0 ? s.acc[j] / s.den[j] : 0.0;
      s.mean[j] = m;
      out_tile[j] = static_cast<scalar_t>(m);
    }

    // ||m_e mean||^2 when nested: entry k covers exactly the columns with count > k, so bucket mean^2 by
    // count (runs of equal count) and hand each entry the suffix sum.
    if (kNested) {
      for (int64_t k = 0; k <= row_count; ++k) s.square_by_count[k] = 0.0;
      int64_t j = 0;
      while (j < n) {
        const int64_t count = s.count[j];
        int64_t end = j + 1;
        while (end < n && s.count[end] == count) ++end;
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = j; i < end; ++i) sum += s.mean[i] * s.mean[i];
        s.square_by_count[count] += sum;
        j = end;
      }
      double suffix = 0.0;
      for (int64_t k = row_count - 1; k >= 0; --k) {
        suffix += s.square_by_count[k + 1];
        part_den[s.row_entry[k] - entry_begin] += suffix;
      }
    }

    // Pass 2: ||m_e (x_e - mean)||^2 (and ||m_e mean||^2 when not nested).
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = s.row_entry[k];
      const int64_t* entry = args.entries + e * kEntryCols;
      const scalar_t* x_row = static_cast<const scalar_t*>(args.data[e]) + s.row_start[k];
      Piece pieces[2];
      const int count = window_pieces(entry[kEntryOffset + ndim - 1], entry[kEntryPacked + ndim - 1], length, c0,
                                      c1, pieces);
      double sum_diff = 0.0, sum_mean = 0.0;
      for (int i = 0; i < count; ++i) {
        const int64_t b = pieces[i].begin - c0, len = pieces[i].end - pieces[i].begin;
        const scalar_t* x = x_row + pieces[i].local;
        const double* mean = s.mean + b;
#pragma omp simd reduction(+ : sum_diff)
        for (int64_t j = 0; j < len; ++j) {
          const double d = static_cast<double>(x[j]) - mean[j];
          sum_diff += d * d;
        }
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
