// CPU implementation of hasfl_ray::aggregate_private_into: the fused aggregation of aggregate_into with client-level
// differential privacy in the same pass (docs/privacy.md, hasfl_ray/ops/aggregate_private.py), and
// hasfl_ray::aggregate_private_sparse_into, the same over the sparse layouts too: dense parameters (leading slices,
// rolling windows, gate blocks: the params/entries tables of csrc/aggregate_layout.h) and, in the sparse form, index
// sets and masks beside them (the kinds/bits/rows tables of csrc/aggregate_sparse_host.h), with `uncounted` entries
// (in their client's norm and divergence, in no sum or k_j: the label split's rows of labels a client does not hold).
// The CUDA form of both ops: cuda/aggregate_private_cuda.cu (the same draws, csrc/private_normal.h).
//
//   phase 1  ||u_i||, client i's L2 norm over every value it holds (float64; each entry's sum of squares in element
//            order, a client's entries summed in parameter order), and its clip scale s_i = min(1, bound_i / ||u_i||);
//   phase 2  per tile of the layout's chunks: acc[j] = sum_e w_e s_e x_e[j], den[j] = sum_e w_e and k_j, the number
//            of entries covering j; mean_j = acc[j] / den[j] (0 where k_j = 0); the noised output
//              fixed-size sampling:  mean_j + xi_j / k_j where k_j > 0, else 0
//              Poisson (expected = qN): (mean_j k_j + xi_j) / expected at every coordinate,
//            xi_j = noise_std * normal(seed, offset, j), j the coordinate's index in the flat output; then the
//            divergence partials of the clipped values against the noiseless mean, as aggregate_into's.
//
// normal(seed, offset, j) is one Philox4x32-10 block (key: seed; counter: offset in the low 64 bits, j in the high
// ones) turned into a standard normal by Box-Muller with ln and cos written out in IEEE operations
// (csrc/private_normal.h, shared with the CUDA kernels: the same bits on either device): it depends on (seed,
// offset, j) alone, never on the threads, the tiling, the order of the work or the device.
// hasfl_ray::private_normals returns these draws (the oracle tests' key).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "aggregate_sparse_host.h"
#include "private_normal.h"

namespace hasfl_ray {
namespace {

using namespace layout;

// Work split (fixes the summation order of the divergence partials): the same as aggregate_into's.
constexpr int64_t kPrivateTile = 1024;
constexpr int64_t kPrivateChunkElems = 32768;

using normal::philox_normal;  // csrc/private_normal.h: the CUDA kernels' draws too

struct PrivateArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const void* const* data;
  const double* entry_weight;
  const double* entry_scale;  // s of each entry's client
  void* out;
  double* counts;             // k_j per output coordinate
  double* partial_num;
  double* partial_den;
  int64_t* chunk_covered;
  double noise_std;
  uint64_t seed;
  uint64_t offset;
  bool poisson;
  double expected;
  const int64_t* kinds;  // per parameter, 1: sparse (index sets, masks); null: every parameter dense
  SparseArgs sparse;     // the sparse tables (read where kinds says sparse)
  const uint8_t* uncounted;  // per entry, 1: in its client's norm and divergence but not in the mean, k_j (the label
                             // split's rows a client trained without holding the label); null: every entry counted
};

// Calls f(j, x) for every column c0 + j < c1 of the current tile that entry e holds, in column order, x its value
// (double): a dense entry's window pieces, or a sparse entry's set bits from its packed run (start: the row's first
// element in e's packed tensor; tile: the tile's index in the row).
template <typename scalar_t, typename F>
inline void for_each_held(const PrivateArgs& args, const ChunkView& v, bool sparse, int64_t e, int64_t start,
                          int64_t tile, int64_t c0, int64_t c1, F&& f) {
  const scalar_t* x_row = static_cast<const scalar_t*>(args.data[e]) + start;
  if (sparse) {
    const uint8_t* m = args.sparse.bits[e];
    const scalar_t* x = x_row + args.sparse.tile_prefix[args.sparse.prefix_begin[e] + tile];
    for (int64_t c = c0; c < c1; ++c)
      if ((m[c >> 3] >> (c & 7)) & 1u) f(c - c0, static_cast<double>(*x++));
    return;
  }
  const int64_t* entry = args.entries + e * kEntryCols;
  Piece pieces[2];
  const int count = window_pieces(entry[kEntryOffset + v.ndim - 1], entry[kEntryPacked + v.ndim - 1], v.length, c0,
                                  c1, pieces);
  for (int i = 0; i < count; ++i) {
    const int64_t b = pieces[i].begin - c0, len = pieces[i].end - pieces[i].begin;
    const scalar_t* x = x_row + pieces[i].local;
    for (int64_t j = 0; j < len; ++j) f(b + j, static_cast<double>(x[j]));
  }
}

template <typename scalar_t>
void run_private_chunk(const PrivateArgs& args, int64_t chunk, double* acc, double* den, double* cnt, double* mean,
                       int64_t* row_entry, int64_t* row_start) {
  const ChunkView v(args.params, args.chunks, chunk, kPrivateTile);
  const bool sparse = args.kinds != nullptr && args.kinds[v.p] == 1;
  double* part_num = v.partials(args.partial_num);
  double* part_den = v.partials(args.partial_den);
  const int64_t base = v.out_offset, length = v.length;
  scalar_t* out = v.output<scalar_t>(args.out);
  const auto sparse_local = [&args, &v](int64_t e, const int64_t* entry, int64_t row) {
    return sparse_local_row(args.sparse, v.param, e, entry, row);
  };
  int64_t covered = 0, current_row = -1, row_count = 0;
  for (int64_t item = v.item_begin; item < v.item_end; ++item) {
    const int64_t row = v.row_of(item), tile = v.tile_of(item);
    const int64_t c0 = v.first_column(item), c1 = v.end_column(item);
    const int64_t n = c1 - c0;
    const int64_t first = row * length + c0;  // the tile's first coordinate inside the parameter
    if (row != current_row) {
      current_row = row;
      row_count = sparse ? v.collect_row<false>(args.entries, row, row_entry, row_start, sparse_local)
                         : v.collect_dense_row<false>(args.entries, row, row_entry, row_start);
    }
    for (int64_t j = 0; j < n; ++j) acc[j] = den[j] = cnt[j] = 0.0;
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = row_entry[k];
      if (args.uncounted != nullptr && args.uncounted[e]) continue;
      const double w = args.entry_weight[e], ws = w * args.entry_scale[e];
      for_each_held<scalar_t>(args, v, sparse, e, row_start[k], tile, c0, c1, [&](int64_t j, double x) {
        acc[j] += ws * x;
        den[j] += w;
        cnt[j] += 1.0;
      });
    }
    for (int64_t j = 0; j < n; ++j) {
      const double k = cnt[j];
      const double m = k > 0.0 ? acc[j] / den[j] : 0.0;
      mean[j] = m;
      args.counts[base + first + j] = k;
      covered += k > 0.0 ? 1 : 0;
      const bool draw = args.noise_std != 0.0 && (args.poisson || k > 0.0);
      const double xi =
          draw ? args.noise_std * philox_normal(args.seed, args.offset, static_cast<uint64_t>(base + first + j)) : 0.0;
      double value;
      if (args.poisson)
        value = (m * k + xi) / args.expected;
      else
        value = k > 0.0 ? m + xi / k : 0.0;
      out[first + j] = static_cast<scalar_t>(value);
    }
    // Divergence partials of the clipped values against the noiseless mean.
    for (int64_t k = 0; k < row_count; ++k) {
      const int64_t e = row_entry[k];
      const double s = args.entry_scale[e];
      double sum_diff = 0.0, sum_mean = 0.0;
      for_each_held<scalar_t>(args, v, sparse, e, row_start[k], tile, c0, c1, [&](int64_t j, double x) {
        const double d = s * x - mean[j];
        sum_diff += d * d;
        sum_mean += mean[j] * mean[j];
      });
      part_num[e - v.entry_begin] += sum_diff;
      part_den[e - v.entry_begin] += sum_mean;
    }
  }
  args.chunk_covered[chunk] = covered;
}

// Each entry's sum of squares in float64, in element order (one entry per task: no dependence on the threads).
template <typename scalar_t>
void entry_squares(at::TensorList packed, double* square) {
  const int64_t num_entries = static_cast<int64_t>(packed.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < num_entries; ++e) {
    const scalar_t* x = packed[e].data_ptr<scalar_t>();
    double sum = 0.0;
    for (int64_t j = 0, n = packed[e].numel(); j < n; ++j) sum += static_cast<double>(x[j]) * static_cast<double>(x[j]);
    square[e] = sum;
  }
}

template <typename scalar_t>
void run_private_chunks(const PrivateArgs& args, int64_t num_chunks, int64_t max_entries) {
#pragma omp parallel
  {
    std::vector<double> doubles(4 * kPrivateTile);
    std::vector<int64_t> ints(2 * max_entries + 1);
    double* d = doubles.data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk)
      run_private_chunk<scalar_t>(args, chunk, d, d + kPrivateTile, d + 2 * kPrivateTile, d + 3 * kPrivateTile,
                                  ints.data(), ints.data() + max_entries);
  }
}

using PrivateResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Both ops' body, after check_aggregate_args: kinds null (every parameter dense) or the sparse tables in `sparse`.
PrivateResult private_pass(const at::Tensor& out, at::TensorList packed, const at::Tensor& params,
                           const at::Tensor& entries, const at::Tensor& weights, const at::Tensor& bounds,
                           double noise_std, int64_t seed, int64_t offset, std::optional<double> expected,
                           const int64_t* kinds, const SparseArgs& sparse, const uint8_t* uncounted) {
  const int64_t num_entries = entries.size(0), num_clients = weights.size(0);
  const double* bound = check_private_args(bounds, num_clients, noise_std, expected);
  const AggregatePlan plan = make_plan(params, entries, weights, kPrivateTile, kPrivateChunkElems);
  const int64_t num_chunks = plan.chunks.size(0);
  const int64_t* E = entries.data_ptr<int64_t>();

  // Phase 1: norms and clip scales.
  std::vector<double> entry_square(num_entries, 0.0);
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_private_into norms",
                             [&] { entry_squares<scalar_t>(packed, entry_square.data()); });
  at::Tensor norms = at::zeros({num_clients}, at::kDouble);
  double* norm = norms.data_ptr<double>();
  const int64_t* cbegin = plan.client_entry_begin.data_ptr<int64_t>();
  const int64_t* centries = plan.client_entries.data_ptr<int64_t>();
  std::vector<double> scale(num_clients, 1.0), entry_scale(num_entries, 1.0);
  for (int64_t i = 0; i < num_clients; ++i) {
    double sum = 0.0;
    for (int64_t k = cbegin[i]; k < cbegin[i + 1]; ++k) sum += entry_square[centries[k]];
    norm[i] = std::sqrt(sum);
    scale[i] = norm[i] <= bound[i] ? 1.0 : bound[i] / norm[i];
  }
  for (int64_t e = 0; e < num_entries; ++e) entry_scale[e] = scale[E[e * kEntryCols + kEntryClient]];

  // Phase 2: the tile pass.
  std::vector<const void*> data(num_entries);
  for (int64_t e = 0; e < num_entries; ++e) data[e] = packed[e].data_ptr();
  at::Tensor counts = at::zeros({out.numel()}, at::kDouble);
  at::Tensor partial_num = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor partial_den = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor chunk_covered = at::zeros({num_chunks}, at::kLong);
  const PrivateArgs args{params.data_ptr<int64_t>(), E, plan.chunks.data_ptr<int64_t>(), data.data(),
                         plan.entry_weight.data_ptr<double>(), entry_scale.data(), out.data_ptr(),
                         counts.data_ptr<double>(), partial_num.data_ptr<double>(), partial_den.data_ptr<double>(),
                         chunk_covered.data_ptr<int64_t>(), noise_std, static_cast<uint64_t>(seed),
                         static_cast<uint64_t>(offset), expected.has_value(), expected.value_or(1.0), kinds, sparse,
                         uncounted};
  const int64_t max_entries = plan.max_entries;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_private_into",
                             [&] { run_private_chunks<scalar_t>(args, num_chunks, max_entries); });

  // Fixed-order reductions (each entry over its parameter's chunks, then each client over its entries).
  at::Tensor div_num = at::zeros({num_clients}, at::kDouble);
  at::Tensor div_den = at::zeros({num_clients}, at::kDouble);
  double* num = div_num.data_ptr<double>();
  double* den = div_den.data_ptr<double>();
  const int64_t* chunk_begin = plan.param_chunk_begin.data_ptr<int64_t>();
  for (int64_t i = 0; i < num_clients; ++i)
    for (int64_t k = cbegin[i]; k < cbegin[i + 1]; ++k) {
      num[i] += reduce_entry(args.params, args.entries, args.chunks, chunk_begin, args.partial_num, centries[k]);
      den[i] += reduce_entry(args.params, args.entries, args.chunks, chunk_begin, args.partial_den, centries[k]);
    }
  return {div_num, div_den, chunk_covered.sum(), counts, norms};
}

PrivateResult aggregate_private_into_cpu(const at::Tensor& out, at::TensorList packed, const at::Tensor& params,
                                         const at::Tensor& entries, const at::Tensor& weights,
                                         const at::Tensor& bounds, double noise_std, int64_t seed, int64_t offset,
                                         std::optional<double> expected) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.device().is_cpu(), "out must be on the CPU for the CPU kernel, got ", out.device());
  return private_pass(out, packed, params, entries, weights, bounds, noise_std, seed, offset, expected, nullptr,
                      SparseArgs{nullptr, nullptr, nullptr, nullptr, nullptr}, nullptr);
}

// Dense and sparse parameters (index sets, masks) in one pass: the tables of aggregate_sparse_into.
PrivateResult aggregate_private_sparse_into_cpu(const at::Tensor& out, at::TensorList packed,
                                                const at::Tensor& params, const at::Tensor& entries,
                                                const at::Tensor& weights, const at::Tensor& bounds, double noise_std,
                                                int64_t seed, int64_t offset, std::optional<double> expected,
                                                const at::Tensor& kinds, at::TensorList bits, const at::Tensor& rows,
                                                const at::Tensor& row_offsets,
                                                const std::optional<at::Tensor>& uncounted) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.device().is_cpu(), "out must be on the CPU for the CPU kernel, got ", out.device());
  const int64_t num_entries = entries.size(0);
  TORCH_CHECK(static_cast<int64_t>(bits.size()) == num_entries, "bits has ", bits.size(), " tensors but entries has ",
              num_entries, " rows");
  TORCH_CHECK(kinds.device().is_cpu() && kinds.scalar_type() == at::kLong && kinds.dim() == 1 &&
                  kinds.size(0) == params.size(0) && kinds.is_contiguous(),
              "kinds must be a contiguous int64 CPU tensor of shape (", params.size(0), "), got ", kinds.sizes());
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  std::vector<const uint8_t*> bits_ptr(num_entries, nullptr);
  std::vector<int64_t> bits_len(num_entries, 0);
  for (int64_t e = 0; e < num_entries; ++e) {
    if (K[E[e * kEntryCols + kEntryParam]] != 1) continue;
    TORCH_CHECK(bits[e].scalar_type() == at::kByte && bits[e].device().is_cpu() && bits[e].is_contiguous() &&
                    bits[e].dim() == 1,
                "bits[", e, "] must be a contiguous 1-D uint8 CPU tensor");
    bits_ptr[e] = bits[e].data_ptr<uint8_t>();
    bits_len[e] = bits[e].numel();
  }
  const SparsePrep prep = prepare_sparse(params, entries, kinds, bits_ptr, bits_len, rows, row_offsets, kPrivateTile);
  const SparseArgs sparse{bits_ptr.data(), prep.row_map.data(), prep.row_map_begin.data(), prep.tile_prefix.data(),
                          prep.prefix_begin.data()};
  const uint8_t* skip = nullptr;
  if (uncounted.has_value()) {
    TORCH_CHECK(uncounted->device().is_cpu() && uncounted->scalar_type() == at::kByte && uncounted->dim() == 1 &&
                    uncounted->is_contiguous() && uncounted->size(0) == num_entries,
                "uncounted must be a contiguous uint8 CPU tensor of shape (", num_entries, "), got ",
                uncounted->sizes(), " ", uncounted->scalar_type(), " on ", uncounted->device());
    skip = uncounted->data_ptr<uint8_t>();
  }
  return private_pass(out, packed, params, entries, weights, bounds, noise_std, seed, offset, expected, K, sparse,
                      skip);
}

// The draws normal(seed, offset, j) for j < n, float64: the torch path's noise and the oracle tests' key (each draw
// depends on j alone, so the threads change nothing).
at::Tensor private_normals(int64_t seed, int64_t offset, int64_t n) {
  TORCH_CHECK(n >= 0, "n is ", n, "; expected >= 0");
  at::Tensor draws = at::empty({n}, at::kDouble);
  double* z = draws.data_ptr<double>();
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j)
    z[j] = philox_normal(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), static_cast<uint64_t>(j));
  return draws;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hasfl_ray, m) {
  // aggregate_into with client-level DP in its pass (see the top of this file): bounds float64 CPU (num_clients,),
  // each client's clip bound (C / its repeats; inf: none); noise_std: z C; seed, offset: the noise's key (run key,
  // update number); expected: Poisson participation's q N, None for fixed-size sampling. Returns (div_num, div_den,
  // covered) as aggregate_into, counts float64 (out.numel(),) k_j, and norms float64 (num_clients,) before clipping.
  m.def("aggregate_private_into(Tensor(a!) out, Tensor[] packed, Tensor params, Tensor entries, Tensor weights, "
        "Tensor bounds, float noise_std, int seed, int offset, float? expected) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  // The same with index sets and masks beside the dense parameters: kinds, bits, rows, row_offsets as for
  // aggregate_sparse_into (csrc/aggregate_sparse_host.h); uncounted: None, or uint8 CPU (E,), 1 where an entry
  // counts in its client's norm and divergence but not in the mean and k_j (the label split's unheld rows).
  m.def("aggregate_private_sparse_into(Tensor(a!) out, Tensor[] packed, Tensor params, Tensor entries, "
        "Tensor weights, Tensor bounds, float noise_std, int seed, int offset, float? expected, Tensor kinds, "
        "Tensor[] bits, Tensor rows, Tensor row_offsets, Tensor? uncounted=None) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("private_normals(int seed, int offset, int n) -> Tensor", &private_normals);
}

TORCH_LIBRARY_IMPL(hasfl_ray, CPU, m) {
  m.impl("aggregate_private_into", &aggregate_private_into_cpu);
  m.impl("aggregate_private_sparse_into", &aggregate_private_sparse_into_cpu);
}

}  // namespace hasfl_ray
