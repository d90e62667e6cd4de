// CUDA implementation of hasfl_ray::aggregate_private_into and hasfl_ray::aggregate_private_sparse_into: the fused
// aggregation with client-level DP in its pass (the CPU one: cpu/aggregate_private.cpp; docs/privacy.md).
// Compiled for sm_90 but NOT YET RUN ON A CARD: tests/aggregation/test_private_cuda.py (in benchmarks/gpu_check.sh)
// is its check against a float64 oracle and the CPU op on a GPU.
//
// Same tables, host checks and result as the CPU op; the work in the sparse CUDA kernel's shape
// (cuda/sparse_access.cuh: a block of 128 threads per chunk, thread j owning column c0 + j; dense entries (kind 0)
// by local_row and local_column, index sets and masks (kind 1) by row maps and bitmask ranks), which serves both
// ops: the dense op is the sparse one with every parameter of kind 0 (as the CPU's private_pass is one body).
//   phase 1  a block per entry: its sum of squares (thread t over elements t, t + 256, ..., then a fixed tree);
//            a thread per client: its entries' sums in parameter order, ||u_i|| and s_i = min(1, bound_i / ||u_i||).
//   phase 2  per chunk and item, thread j over the counted entries holding column j, in entry order:
//            acc = acc + (w s) x, den = den + w, k = k + 1, each operation rounded once as the CPU kernel's (explicit
//            round-to-nearest intrinsics: the build's --use_fast_math would fuse them); mean = acc / den (0 where
//            k = 0), xi_j = noise_std * normal(seed, offset, j) (csrc/private_normal.h: the CPU op's bits) and the
//            noised value as the CPU's; k_j to counts. Then every entry holding the row, the uncounted too: (s x -
//            mean)^2 and mean^2 over its columns, a warp sum into the slot of (chunk, entry, warp).
//   then     a thread per client adds its entries' partials (sparse_reduce_kernel).
// Where no update is clipped (every s_i = 1) the output and k_j are the CPU op's bit for bit; a clipped s_i comes from
// a norm summed in another order, and the divergence norms are summed in another order (both to rounding). The PTX
// has no fma.f64 (checked: mul.rn/add.rn/sub.rn/div.rn/sqrt.rn only). One exception to the bits: the build's
// --use_fast_math flushes float32 subnormals (|x| < 1.2e-38) to zero when read or written, as every CUDA kernel here.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "aggregate_sparse_host.h"
#include "cuda/sparse_access.cuh"
#include "cuda/sparse_tables.h"
#include "private_normal.h"

namespace hasfl_ray {
namespace {

using namespace layout;
namespace nm = normal;

constexpr int kSquareThreads = 256;

struct PrivateCudaArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const int64_t* kinds;          // per parameter: 0 dense, 1 sparse
  const int64_t* data;           // per entry: address of its packed tensor
  const double* entry_weight;    // per entry
  const int64_t* bits_at;        // per entry: start of its bitmask in bits (kind 1)
  const int64_t* row_map_begin;  // (E, kMaxDims)
  const int64_t* prefix_begin;   // (E)
  const int64_t* tile_prefix;
  const int32_t* row_map;
  const uint8_t* bits;
  const int64_t* uncounted;      // per entry: 1 where it is in its client's norm and divergence, not in any mean
  const double* client_scale;    // per client: s_i (phase 1)
  void* out;
  double* counts;                // k_j per output coordinate
  double* partial_num;           // (num_partials, kSparseWarps)
  double* partial_den;
  int64_t* chunk_covered;
  double noise_std;
  uint64_t seed;
  uint64_t offset;
  bool poisson;
  double expected;
};

template <typename scalar_t>
__global__ void __launch_bounds__(kSquareThreads) entry_squares_kernel(const int64_t* data, const int64_t* numel,
                                                                       double* square) {
  __shared__ double part[kSquareThreads];
  const int64_t e = blockIdx.x;
  const int t = threadIdx.x;
  const scalar_t* x = reinterpret_cast<const scalar_t*>(data[e]);
  double sum = 0.0;
  for (int64_t i = t; i < numel[e]; i += kSquareThreads) {
    const double v = static_cast<double>(x[i]);
    sum = nm::add(sum, nm::mul(v, v));
  }
  part[t] = sum;
  __syncthreads();
  for (int half = kSquareThreads / 2; half > 0; half /= 2) {
    if (t < half) part[t] = nm::add(part[t], part[t + half]);
    __syncthreads();
  }
  if (t == 0) square[e] = part[0];
}

__global__ void client_scales_kernel(const int64_t* client_entry_begin, const int64_t* client_entries,
                                     const double* square, const double* bound, int64_t num_clients, double* norm,
                                     double* scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_clients) return;
  double sum = 0.0;
  for (int64_t k = client_entry_begin[i]; k < client_entry_begin[i + 1]; ++k)
    sum = nm::add(sum, square[client_entries[k]]);
  norm[i] = nm::root(sum);
  scale[i] = norm[i] <= bound[i] ? 1.0 : nm::quotient(bound[i], norm[i]);
}

template <typename scalar_t>
__device__ __forceinline__ double value_at(const PrivateCudaArgs& a, int64_t e, int64_t at) {
  return static_cast<double>(reinterpret_cast<const scalar_t*>(a.data[e])[at]);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSparseThreads) private_chunks_kernel(PrivateCudaArgs a) {
  __shared__ long long covered_of[kSparseThreads];
  const int64_t chunk = blockIdx.x;
  const int j = threadIdx.x, warp = j / 32, lane = j % 32;
  const int64_t* chunk_row = a.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = a.params + p * kParamCols;
  const bool sparse = a.kinds[p] != 0;
  const int64_t length = row_length(param);
  const int64_t tiles = ceil_div(length, kSparseTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  const int64_t base = chunk_row[kChunkPartialBase], out_offset = param[kParamOutOffset];
  scalar_t* out = static_cast<scalar_t*>(a.out) + out_offset;
  long long covered = 0;
  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles, tile = item % tiles, c0 = tile * kSparseTile;
    const bool active = j < length - c0;
    const int64_t coordinate = row * length + c0 + j;  // inside the parameter
    double acc = 0.0, den = 0.0, k = 0.0;
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      if (a.uncounted[e]) continue;
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0 || !active) continue;
      const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
      if (at < 0) continue;
      const double w = a.entry_weight[e];
      const double ws = nm::mul(w, a.client_scale[a.entries[e * kEntryCols + kEntryClient]]);
      acc = nm::add(acc, nm::mul(ws, value_at<scalar_t>(a, e, at)));
      den = nm::add(den, w);
      k = nm::add(k, 1.0);
    }
    const double mean = k > 0.0 ? nm::quotient(acc, den) : 0.0;
    if (active) {
      a.counts[out_offset + coordinate] = k;
      covered += k > 0.0 ? 1 : 0;
      const bool draw = a.noise_std != 0.0 && (a.poisson || k > 0.0);
      const double xi =
          draw ? nm::mul(a.noise_std, nm::philox_normal(a.seed, a.offset, static_cast<uint64_t>(out_offset + coordinate)))
               : 0.0;
      double value;
      if (a.poisson)
        value = nm::quotient(nm::add(nm::mul(mean, k), xi), a.expected);
      else
        value = k > 0.0 ? nm::add(mean, nm::quotient(xi, k)) : 0.0;
      out[coordinate] = static_cast<scalar_t>(value);
    }
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0) continue;  // uniform over the block: every lane reaches the shuffles below
      double diff = 0.0, square = 0.0;
      if (active) {
        const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
        if (at >= 0) {
          const double s = a.client_scale[a.entries[e * kEntryCols + kEntryClient]];
          const double d = nm::sub(nm::mul(s, value_at<scalar_t>(a, e, at)), mean);
          diff = nm::mul(d, d);
          square = nm::mul(mean, mean);
        }
      }
      diff = sparse_warp_sum(diff);
      square = sparse_warp_sum(square);
      if (lane == 0) {
        const int64_t slot = (base + e - entry_begin) * kSparseWarps + warp;
        a.partial_num[slot] += diff;
        a.partial_den[slot] += square;
      }
    }
  }
  covered_of[j] = covered;
  __syncthreads();
  if (j == 0) {
    long long total = 0;
    for (int t = 0; t < kSparseThreads; ++t) total += covered_of[t];
    a.chunk_covered[chunk] = total;
  }
}

using PrivateResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Both ops' body: kinds (CPU int64, P) and the sparse tables (bits on the host, read where kinds is 1).
PrivateResult private_cuda(const at::Tensor& out, at::TensorList packed, const at::Tensor& params,
                           const at::Tensor& entries, const at::Tensor& weights, const at::Tensor& bounds,
                           double noise_std, int64_t seed, int64_t offset, std::optional<double> expected,
                           const at::Tensor& kinds, const std::vector<const uint8_t*>& bits_ptr,
                           const std::vector<int64_t>& bits_len, const at::Tensor& rows, const at::Tensor& row_offsets,
                           const std::optional<at::Tensor>& uncounted) {
  const int64_t num_params = params.size(0), num_entries = entries.size(0), num_clients = weights.size(0);
  const double* bound = check_private_args(bounds, num_clients, noise_std, expected);
  if (uncounted.has_value())
    TORCH_CHECK(uncounted->device().is_cpu() && uncounted->scalar_type() == at::kByte && uncounted->dim() == 1 &&
                    uncounted->is_contiguous() && uncounted->size(0) == num_entries,
                "uncounted must be a contiguous uint8 CPU tensor of shape (", num_entries, "), got ",
                uncounted->sizes(), " ", uncounted->scalar_type(), " on ", uncounted->device());
  const c10::cuda::CUDAGuard guard(out.device());
  std::vector<int64_t> bits_at;
  const int64_t bits_total = sparse_cuda::bitmask_offsets(bits_ptr, bits_len, bits_at);
  const SparsePrep prep = prepare_sparse(params, entries, kinds, bits_ptr, bits_len, rows, row_offsets, kSparseTile);
  const AggregatePlan plan = make_plan(params, entries, weights, kSparseTile, kSparseChunkElems);
  const int64_t num_chunks = plan.chunks.size(0);
  const auto device = out.device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());

  // Tables: one pinned int64 buffer (float64 as bit patterns); the row maps (int32) and bitmasks (bytes) after it.
  int64_t words = 0;
  const auto place = [&words](int64_t count) { const int64_t at = words; words += count; return at; };
  const int64_t at_params = place(num_params * kParamCols), at_entries = place(num_entries * kEntryCols);
  const int64_t at_chunks = place(num_chunks * kChunkCols), at_chunk_begin = place(num_params + 1);
  const int64_t at_client_begin = place(num_clients + 1), at_client_entries = place(num_entries);
  const int64_t at_kinds = place(num_params), at_data = place(num_entries), at_numel = place(num_entries);
  const int64_t at_weight = place(num_entries), at_bound = place(num_clients), at_uncounted = place(num_entries);
  const int64_t at_bits_at = place(num_entries), at_map_begin = place(num_entries * kMaxDims);
  const int64_t at_prefix_begin = place(num_entries), at_prefix = place(static_cast<int64_t>(prep.tile_prefix.size()));
  const int64_t int_words = ceil_div(words, 2) * 2;
  const int64_t map_words = ceil_div(static_cast<int64_t>(prep.row_map.size()), 4) * 2;  // int32 pairs, 16-byte runs
  const int64_t table_words = int_words + map_words + ceil_div(bits_total, 16) * 2;
  at::Tensor host = at::zeros({max64(table_words, 2)}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* h = host.data_ptr<int64_t>();
  const auto put = [&](int64_t at, const void* from, int64_t count) {
    if (count > 0) std::memcpy(h + at, from, count * sizeof(int64_t));
  };
  const int64_t* E = entries.data_ptr<int64_t>();
  put(at_params, params.data_ptr<int64_t>(), num_params * kParamCols);
  put(at_entries, E, num_entries * kEntryCols);
  put(at_chunks, plan.chunks.data_ptr<int64_t>(), num_chunks * kChunkCols);
  put(at_chunk_begin, plan.param_chunk_begin.data_ptr<int64_t>(), num_params + 1);
  put(at_client_begin, plan.client_entry_begin.data_ptr<int64_t>(), num_clients + 1);
  put(at_client_entries, plan.client_entries.data_ptr<int64_t>(), num_entries);
  put(at_kinds, kinds.data_ptr<int64_t>(), num_params);
  put(at_weight, plan.entry_weight.data_ptr<double>(), num_entries);
  put(at_bound, bound, num_clients);
  put(at_bits_at, bits_at.data(), num_entries);
  put(at_map_begin, prep.row_map_begin.data(), num_entries * kMaxDims);
  put(at_prefix_begin, prep.prefix_begin.data(), num_entries);
  put(at_prefix, prep.tile_prefix.data(), static_cast<int64_t>(prep.tile_prefix.size()));
  for (int64_t e = 0; e < num_entries; ++e) {
    h[at_data + e] = reinterpret_cast<int64_t>(packed[e].data_ptr());
    h[at_numel + e] = packed[e].numel();
    h[at_uncounted + e] = uncounted.has_value() ? uncounted->data_ptr<uint8_t>()[e] != 0 : 0;
  }
  if (!prep.row_map.empty()) std::memcpy(h + int_words, prep.row_map.data(), prep.row_map.size() * sizeof(int32_t));
  uint8_t* host_bits = reinterpret_cast<uint8_t*>(h + int_words + map_words);
  for (int64_t e = 0; e < num_entries; ++e)
    if (bits_ptr[e] != nullptr && bits_len[e] > 0) std::memcpy(host_bits + bits_at[e], bits_ptr[e], bits_len[e]);
  at::Tensor tables = at::empty({host.numel()}, at::TensorOptions().dtype(at::kLong).device(device));
  tables.copy_(host, /*non_blocking=*/true);
  const int64_t* d = tables.data_ptr<int64_t>();

  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device);
  const int64_t slots = plan.num_partials * kSparseWarps;
  at::Tensor sums = at::zeros({max64(2 * slots, 1)}, doubles);
  at::Tensor scratch = at::empty({max64(num_entries + num_clients, 1)}, doubles);  // entry squares, client scales
  at::Tensor norms = at::zeros({num_clients}, doubles);
  at::Tensor counts = at::zeros({out.numel()}, doubles);
  at::Tensor chunk_covered = at::zeros({max64(num_chunks, 1)}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor div_num = at::zeros({num_clients}, doubles);
  at::Tensor div_den = at::zeros({num_clients}, doubles);
  double* square = scratch.data_ptr<double>();
  double* scale = square + num_entries;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_private_into_cuda", [&] {
    if (num_entries > 0) {
      entry_squares_kernel<scalar_t><<<static_cast<unsigned>(num_entries), kSquareThreads, 0, stream>>>(
          d + at_data, d + at_numel, square);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (num_clients > 0) {
      client_scales_kernel<<<static_cast<unsigned>(ceil_div(num_clients, 128)), 128, 0, stream>>>(
          d + at_client_begin, d + at_client_entries, square, reinterpret_cast<const double*>(d + at_bound),
          num_clients, norms.data_ptr<double>(), scale);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (num_chunks > 0) {
      const PrivateCudaArgs args{d + at_params, d + at_entries, d + at_chunks, d + at_kinds, d + at_data,
                                 reinterpret_cast<const double*>(d + at_weight), d + at_bits_at, d + at_map_begin,
                                 d + at_prefix_begin, d + at_prefix, reinterpret_cast<const int32_t*>(d + int_words),
                                 reinterpret_cast<const uint8_t*>(d + int_words + map_words), d + at_uncounted, scale,
                                 out.data_ptr(), counts.data_ptr<double>(), sums.data_ptr<double>(),
                                 sums.data_ptr<double>() + slots, chunk_covered.data_ptr<int64_t>(), noise_std,
                                 static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), expected.has_value(),
                                 expected.value_or(1.0)};
      private_chunks_kernel<scalar_t><<<static_cast<unsigned>(num_chunks), kSparseThreads, 0, stream>>>(args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  if (num_clients > 0) {
    sparse_reduce_kernel<<<static_cast<unsigned>(ceil_div(num_clients, 128)), 128, 0, stream>>>(
        d + at_params, d + at_entries, d + at_chunks, d + at_chunk_begin, d + at_client_begin, d + at_client_entries,
        sums.data_ptr<double>(), sums.data_ptr<double>() + slots, num_clients, div_num.data_ptr<double>(),
        div_den.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {div_num, div_den, chunk_covered.sum(), counts, norms};
}

PrivateResult aggregate_private_into_cuda(const at::Tensor& out, at::TensorList packed, const at::Tensor& params,
                                          const at::Tensor& entries, const at::Tensor& weights,
                                          const at::Tensor& bounds, double noise_std, int64_t seed, int64_t offset,
                                          std::optional<double> expected) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const int64_t num_entries = entries.size(0);
  const at::Tensor kinds = at::zeros({params.size(0)}, at::kLong);  // every parameter dense
  const std::vector<const uint8_t*> bits_ptr(num_entries, nullptr);
  const std::vector<int64_t> bits_len(num_entries, 0);
  return private_cuda(out, packed, params, entries, weights, bounds, noise_std, seed, offset, expected, kinds,
                      bits_ptr, bits_len, at::zeros({0}, at::kLong), at::zeros({num_entries, kMaxDims}, at::kLong),
                      std::nullopt);
}

PrivateResult aggregate_private_sparse_into_cuda(const at::Tensor& out, at::TensorList packed,
                                                 const at::Tensor& params, const at::Tensor& entries,
                                                 const at::Tensor& weights, const at::Tensor& bounds, double noise_std,
                                                 int64_t seed, int64_t offset, std::optional<double> expected,
                                                 const at::Tensor& kinds, at::TensorList bits, const at::Tensor& rows,
                                                 const at::Tensor& row_offsets,
                                                 const std::optional<at::Tensor>& uncounted) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const sparse_cuda::HostBitmasks masks = sparse_cuda::host_bitmasks(entries, kinds, params.size(0), bits);
  const std::vector<const uint8_t*>& bits_ptr = masks.ptr;
  const std::vector<int64_t>& bits_len = masks.len;
  return private_cuda(out, packed, params, entries, weights, bounds, noise_std, seed, offset, expected, kinds,
                      bits_ptr, bits_len, rows, row_offsets, uncounted);
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) {
  m.impl("aggregate_private_into", &aggregate_private_into_cuda);
  m.impl("aggregate_private_sparse_into", &aggregate_private_sparse_into_cuda);
}

}  // namespace hasfl_ray
