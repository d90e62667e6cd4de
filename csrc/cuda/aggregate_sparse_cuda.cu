// CUDA implementation of hasfl_ray::aggregate_sparse_into: parameters whose clients hold index sets or masks
// (kind 1, see csrc/aggregate_sparse_host.h) beside slices and windows (kind 0), gathered in one pass.
//
// Same tables and host checks as the CPU op (prepare_sparse: row maps, per-tile prefixes of the column bitmask,
// here over tiles of kSparseTile = 128 columns; make_plan: the work split into chunks). Mapping:
//   grid:   one block of 128 threads per chunk (a run of items of one parameter).
//   item:   one row and a tile of <= 128 columns of its last dim; thread j owns column c0 + j.
//   entry:  whether it holds the row is uniform over the block (kind 1: the row map of every row dim; kind 0:
//           local_row, the dense kernel's arithmetic). Kind 1: the thread's bit of the tile's 16 bitmask bytes (one
//           broadcast read per warp) and its rank among the tile's set bits (popcount of the bits below it) give
//           the value's place, row start + tile prefix + rank, in the packed tensor. Kind 0: local_column.
//   pass 1: acc = fma(w, x, acc) and den += w over the holding entries, in entry order (as the CPU kernels);
//           mean = acc / den (0 where no entry holds the column), written to out.
//   pass 2: per holding entry, (x - mean)^2 and mean^2 over the held columns, a warp sum (fixed xor-shuffle tree)
//           added by lane 0 to the slot of (chunk, entry, warp): one writer per slot, no atomics.
//   then:   a thread per client adds its entries (parameter order), each entry its chunks (in order), each chunk
//           its 4 warps (in order). Deterministic from run to run on a given GPU.
// Bitmasks arrive on the host (they are read there anyway) and travel to the device with the tables, each entry's
// padded to a multiple of 16 bytes so a tile's 16 bytes can always be read.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "aggregate_sparse_host.h"
#include "cuda/sparse_access.cuh"

namespace hasfl_ray {
namespace {

using namespace layout;

struct SparseCudaArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const int64_t* kinds;          // per parameter
  const int64_t* data;           // per entry: address of its packed tensor
  const double* entry_weight;    // per entry
  const int64_t* bits_at;        // per entry: start of its bitmask in bits (kind 1)
  const int64_t* row_map_begin;  // (E, kMaxDims)
  const int64_t* prefix_begin;   // (E)
  const int64_t* tile_prefix;
  const int32_t* row_map;
  const uint8_t* bits;
  void* out;
  double* partial_num;  // (num_partials, kSparseWarps): [(chunk partial base + local entry) * warps + warp]
  double* partial_den;
  int64_t* chunk_covered;
};

template <typename scalar_t>
__global__ void __launch_bounds__(kSparseThreads) sparse_chunks_kernel(SparseCudaArgs a) {
  __shared__ long long counts[kSparseThreads];
  const int64_t chunk = blockIdx.x;
  const int j = threadIdx.x, warp = j / 32, lane = j % 32;
  const int64_t* chunk_row = a.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = a.params + p * kParamCols;
  const bool sparse = a.kinds[p] != 0;
  const int64_t length = row_length(param);
  const int64_t tiles = ceil_div(length, kSparseTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  const int64_t base = chunk_row[kChunkPartialBase];
  scalar_t* out = static_cast<scalar_t*>(a.out) + param[kParamOutOffset];
  long long covered = 0;
  for (int64_t item = chunk_row[kChunkItemBegin]; item < chunk_row[kChunkItemEnd]; ++item) {
    const int64_t row = item / tiles, tile = item % tiles, c0 = tile * kSparseTile;
    const bool active = j < length - c0;
    double acc = 0.0, den = 0.0;
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0 || !active) continue;
      const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
      if (at < 0) continue;
      const double w = a.entry_weight[e];
      acc = fma(w, static_cast<double>(reinterpret_cast<const scalar_t*>(a.data[e])[at]), acc);
      den += w;
    }
    const double mean = den > 0.0 ? acc / den : 0.0;
    if (active) {
      out[row * length + c0 + j] = static_cast<scalar_t>(mean);
      covered += den > 0.0 ? 1 : 0;
    }
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t start = sparse_row_start(a, param, sparse, e, row);
      if (start < 0) continue;  // uniform over the block: every lane reaches the shuffles below
      double diff = 0.0, square = 0.0;
      if (active) {
        const int64_t at = sparse_element(a, param, sparse, e, start, tile, c0, j);
        if (at >= 0) {
          const double d = static_cast<double>(reinterpret_cast<const scalar_t*>(a.data[e])[at]) - mean;
          diff = d * d;
          square = mean * mean;
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
  counts[j] = covered;
  __syncthreads();
  if (j == 0) {
    long long total = 0;
    for (int t = 0; t < kSparseThreads; ++t) total += counts[t];
    a.chunk_covered[chunk] = total;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sparse_into_cuda(
    const at::Tensor& out, at::TensorList packed, const at::Tensor& params, const at::Tensor& entries,
    const at::Tensor& weights, const at::Tensor& kinds, at::TensorList bits, const at::Tensor& rows,
    const at::Tensor& row_offsets) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t num_params = params.size(0), num_entries = entries.size(0), num_clients = weights.size(0);
  TORCH_CHECK(static_cast<int64_t>(bits.size()) == num_entries, "bits has ", bits.size(), " tensors but entries has ",
              num_entries, " rows");
  TORCH_CHECK(kinds.device().is_cpu() && kinds.scalar_type() == at::kLong && kinds.dim() == 1 &&
                  kinds.size(0) == num_params && kinds.is_contiguous(),
              "kinds must be a contiguous int64 CPU tensor of shape (", num_params, ")");
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  std::vector<const uint8_t*> bits_ptr(num_entries, nullptr);
  std::vector<int64_t> bits_len(num_entries, 0), bits_at(num_entries, 0);
  int64_t bits_total = 0;
  for (int64_t e = 0; e < num_entries; ++e) {
    if (K[E[e * kEntryCols + kEntryParam]] == 0) continue;
    TORCH_CHECK(bits[e].scalar_type() == at::kByte && bits[e].device().is_cpu() && bits[e].is_contiguous() &&
                    bits[e].dim() == 1,
                "bits[", e, "] must be a contiguous 1-D uint8 CPU tensor (the CUDA kernel copies it to the device)");
    bits_ptr[e] = bits[e].data_ptr<uint8_t>();
    bits_len[e] = bits[e].numel();
    bits_at[e] = bits_total;
    bits_total += ceil_div(bits_len[e], 16) * 16 + 16;  // room for a tile's 16 bytes past the last full one
  }
  const SparsePrep prep = prepare_sparse(params, entries, kinds, bits_ptr, bits_len, rows, row_offsets, kSparseTile);
  const AggregatePlan plan = make_plan(params, entries, weights, kSparseTile, kSparseChunkElems);
  const int64_t num_chunks = plan.chunks.size(0);
  const auto device = out.device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());

  // Tables: one pinned int64 buffer; the row maps (int32) and the bitmasks (bytes) after it, 16-byte aligned.
  const int64_t at_params = 0;
  const int64_t at_entries = at_params + num_params * kParamCols;
  const int64_t at_chunks = at_entries + num_entries * kEntryCols;
  const int64_t at_chunk_begin = at_chunks + num_chunks * kChunkCols;
  const int64_t at_client_begin = at_chunk_begin + num_params + 1;
  const int64_t at_client_entries = at_client_begin + num_clients + 1;
  const int64_t at_kinds = at_client_entries + num_entries;
  const int64_t at_data = at_kinds + num_params;
  const int64_t at_weight = at_data + num_entries;
  const int64_t at_bits_at = at_weight + num_entries;
  const int64_t at_map_begin = at_bits_at + num_entries;
  const int64_t at_prefix_begin = at_map_begin + num_entries * kMaxDims;
  const int64_t at_prefix = at_prefix_begin + num_entries;
  const int64_t int_words = ceil_div(at_prefix + static_cast<int64_t>(prep.tile_prefix.size()), 2) * 2;
  const int64_t map_words = ceil_div(static_cast<int64_t>(prep.row_map.size()), 4) * 2;  // int32 pairs, 16-byte runs
  const int64_t bit_words = ceil_div(bits_total, 16) * 2;
  const int64_t table_words = int_words + map_words + bit_words;
  at::Tensor host = at::zeros({max64(table_words, 2)}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* h = host.data_ptr<int64_t>();
  const auto put = [&](int64_t at, const void* from, int64_t words) {
    if (words > 0) std::memcpy(h + at, from, words * sizeof(int64_t));
  };
  put(at_params, params.data_ptr<int64_t>(), num_params * kParamCols);
  put(at_entries, E, num_entries * kEntryCols);
  put(at_chunks, plan.chunks.data_ptr<int64_t>(), num_chunks * kChunkCols);
  put(at_chunk_begin, plan.param_chunk_begin.data_ptr<int64_t>(), num_params + 1);
  put(at_client_begin, plan.client_entry_begin.data_ptr<int64_t>(), num_clients + 1);
  put(at_client_entries, plan.client_entries.data_ptr<int64_t>(), num_entries);
  put(at_kinds, K, num_params);
  put(at_weight, plan.entry_weight.data_ptr<double>(), num_entries);  // float64 bit patterns
  put(at_bits_at, bits_at.data(), num_entries);
  put(at_map_begin, prep.row_map_begin.data(), num_entries * kMaxDims);
  put(at_prefix_begin, prep.prefix_begin.data(), num_entries);
  put(at_prefix, prep.tile_prefix.data(), static_cast<int64_t>(prep.tile_prefix.size()));
  for (int64_t e = 0; e < num_entries; ++e) h[at_data + e] = reinterpret_cast<int64_t>(packed[e].data_ptr());
  if (!prep.row_map.empty())
    std::memcpy(h + int_words, prep.row_map.data(), prep.row_map.size() * sizeof(int32_t));
  uint8_t* host_bits = reinterpret_cast<uint8_t*>(h + int_words + map_words);
  for (int64_t e = 0; e < num_entries; ++e)
    if (bits_ptr[e] != nullptr && bits_len[e] > 0) std::memcpy(host_bits + bits_at[e], bits_ptr[e], bits_len[e]);
  at::Tensor tables = at::empty({host.numel()}, at::TensorOptions().dtype(at::kLong).device(device));
  tables.copy_(host, /*non_blocking=*/true);
  const int64_t* d = tables.data_ptr<int64_t>();

  const int64_t slots = plan.num_partials * kSparseWarps;
  at::Tensor sums = at::zeros({max64(2 * slots, 1)}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor chunk_covered = at::zeros({max64(num_chunks, 1)}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor div_num = at::zeros({num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor div_den = at::zeros({num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  if (num_chunks > 0) {
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_sparse_into_cuda", [&] {
      const SparseCudaArgs args{d + at_params,
                                d + at_entries,
                                d + at_chunks,
                                d + at_kinds,
                                d + at_data,
                                reinterpret_cast<const double*>(d + at_weight),
                                d + at_bits_at,
                                d + at_map_begin,
                                d + at_prefix_begin,
                                d + at_prefix,
                                reinterpret_cast<const int32_t*>(d + int_words),
                                reinterpret_cast<const uint8_t*>(d + int_words + map_words),
                                out.data_ptr(),
                                sums.data_ptr<double>(),
                                sums.data_ptr<double>() + slots,
                                chunk_covered.data_ptr<int64_t>()};
      sparse_chunks_kernel<scalar_t><<<static_cast<unsigned>(num_chunks), kSparseThreads, 0, stream>>>(args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  if (num_clients > 0) {
    sparse_reduce_kernel<<<static_cast<unsigned>(ceil_div(num_clients, 128)), 128, 0, stream>>>(
        d + at_params, d + at_entries, d + at_chunks, d + at_chunk_begin, d + at_client_begin, d + at_client_entries,
        sums.data_ptr<double>(), sums.data_ptr<double>() + slots, num_clients, div_num.data_ptr<double>(),
        div_den.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) { m.impl("aggregate_sparse_into", &aggregate_sparse_into_cuda); }

}  // namespace hasfl_ray
