// CUDA implementation of hasfl_ray::aggregate_into: the CPU kernel's algorithm with a warp per item.
//
// Same descriptor, same index arithmetic (csrc/aggregate_layout.h, shared line for line with the CPU
// kernel), same definition of the result. Mapping: one block per chunk, one warp per item (a row and a
// tile of kGpuTile = 32 lanes x kColsPerLane columns), lane l owning columns c0 + l + 32 q, so every
// load of a client's row is coalesced. Per item:
//   pass 1: every lane adds w_e * x_e[c] and w_e over the entries covering the row (nested parameters
//           stop at the first entry that misses it, as on the CPU),
//   mean:   acc / den where den > 0, else 0; written to out,
//   pass 2: the same entries again (their bytes were just read, so mostly from L2): per entry a warp
//           sum of (x_e[c] - mean[c])^2 and mean[c]^2 by xor-shuffles, added by lane 0 to the warp's
//           own slot. No atomics: slots are per warp, summed over warps in a fixed order at the end of
//           the chunk, then over chunks (entry kernel) and entries (client kernel) in a fixed order.
// Deterministic from run to run on a given GPU; not bit-identical to the CPU kernel (other sum order).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // not ATen/cuda/CUDAContext.h: that one needs the cuSPARSE/cuBLAS headers
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "aggregate_host.h"
#include "aggregate_layout.h"

namespace hasfl_ray {
namespace {

using namespace layout;

constexpr int kWarpSize = 32;
constexpr int kWarps = 8;  // warps per block
constexpr int kColsPerLane = 4;
constexpr int64_t kGpuTile = kWarpSize * kColsPerLane;
constexpr int64_t kGpuChunkElems = 4096;

struct CudaArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const int64_t* data;  // per entry: address of its packed tensor
  const double* entry_weight;
  void* out;
  double* partial_num;
  double* partial_den;
  int64_t* chunk_covered;
  double* warp_scratch;  // nullptr: dynamic shared memory; else global, max_entries * kWarps * 2 per chunk
  int64_t max_entries;
};

__device__ __forceinline__ double warp_sum(double value) {
#pragma unroll
  for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}

__device__ __forceinline__ int64_t warp_sum(int64_t value) {
#pragma unroll
  for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kWarps * kWarpSize) aggregate_chunks_kernel(CudaArgs args) {
  extern __shared__ double shared_scratch[];
  const int64_t chunk = blockIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t* chunk_row = args.chunks + chunk * kChunkCols;
  const int64_t p = chunk_row[kChunkParam];
  const int64_t* param = args.params + p * kParamCols;
  const int64_t ndim = param[kParamNdim];
  const int64_t length = row_length(param);
  const int64_t tiles = tiles_per_row(param, kGpuTile);
  const int64_t entry_begin = param[kParamEntryBegin], entry_end = param[kParamEntryEnd];
  const int64_t num_entries = entry_end - entry_begin;
  const bool nested = param[kParamNested] != 0;
  scalar_t* out = static_cast<scalar_t*>(args.out) + param[kParamOutOffset];

  // Per (entry, warp) norm slots: [entry][warp][num, den].
  double* slots = args.warp_scratch ? args.warp_scratch + chunk * args.max_entries * kWarps * 2 : shared_scratch;
  for (int64_t i = threadIdx.x; i < num_entries * kWarps * 2; i += blockDim.x) slots[i] = 0.0;
  __syncthreads();

  int64_t covered = 0;
  for (int64_t item = chunk_row[kChunkItemBegin] + warp; item < chunk_row[kChunkItemEnd]; item += kWarps) {
    const int64_t row = item / tiles;
    const int64_t c0 = (item % tiles) * kGpuTile;
    const int64_t c1 = min64(c0 + kGpuTile, length);

    // Pass 1: weighted sums and covering weights per column.
    double acc[kColsPerLane], den[kColsPerLane];
#pragma unroll
    for (int q = 0; q < kColsPerLane; ++q) acc[q] = den[q] = 0.0;
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t* entry = args.entries + e * kEntryCols;
      const int64_t local = local_row(param, entry, row);
      if (local < 0) {
        if (nested) break;
        continue;
      }
      const int64_t offset = entry[kEntryOffset + ndim - 1], width = entry[kEntryPacked + ndim - 1];
      const scalar_t* x_row = reinterpret_cast<const scalar_t*>(args.data[e]) + local * width;
      const double w = args.entry_weight[e];
#pragma unroll
      for (int q = 0; q < kColsPerLane; ++q) {
        const int64_t column = c0 + lane + q * kWarpSize;
        const int64_t l = column < c1 ? local_column(column, offset, width, length) : -1;
        if (l >= 0) {
          acc[q] += w * static_cast<double>(x_row[l]);
          den[q] += w;
        }
      }
    }

    // Mean over exactly the covering entries; 0 where none covers.
    double mean[kColsPerLane];
#pragma unroll
    for (int q = 0; q < kColsPerLane; ++q) {
      const int64_t column = c0 + lane + q * kWarpSize;
      mean[q] = den[q] > 0.0 ? acc[q] / den[q] : 0.0;
      if (column < c1) {
        out[row * length + column] = static_cast<scalar_t>(mean[q]);
        covered += den[q] > 0.0 ? 1 : 0;
      }
    }

    // Pass 2: per entry, ||m_e (x_e - mean)||^2 and ||m_e mean||^2 over this item.
    for (int64_t e = entry_begin; e < entry_end; ++e) {
      const int64_t* entry = args.entries + e * kEntryCols;
      const int64_t local = local_row(param, entry, row);
      if (local < 0) {
        if (nested) break;
        continue;
      }
      const int64_t offset = entry[kEntryOffset + ndim - 1], width = entry[kEntryPacked + ndim - 1];
      const scalar_t* x_row = reinterpret_cast<const scalar_t*>(args.data[e]) + local * width;
      double sum_diff = 0.0, sum_mean = 0.0;
#pragma unroll
      for (int q = 0; q < kColsPerLane; ++q) {
        const int64_t column = c0 + lane + q * kWarpSize;
        const int64_t l = column < c1 ? local_column(column, offset, width, length) : -1;
        if (l >= 0) {
          const double d = static_cast<double>(x_row[l]) - mean[q];
          sum_diff += d * d;
          sum_mean += mean[q] * mean[q];
        }
      }
      sum_diff = warp_sum(sum_diff);
      sum_mean = warp_sum(sum_mean);
      if (lane == 0) {
        double* slot = slots + ((e - entry_begin) * kWarps + warp) * 2;
        slot[0] += sum_diff;
        slot[1] += sum_mean;
      }
    }
  }

  // Covered count: integers, so the order does not matter.
  __shared__ int64_t warp_covered[kWarps];
  covered = warp_sum(covered);
  if (lane == 0) warp_covered[warp] = covered;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_covered[w];
    args.chunk_covered[chunk] = total;
  }
  // This chunk's partial per entry: its warps' slots in warp order.
  for (int64_t k = threadIdx.x; k < num_entries; k += blockDim.x) {
    double sum_diff = 0.0, sum_mean = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      sum_diff += slots[(k * kWarps + w) * 2];
      sum_mean += slots[(k * kWarps + w) * 2 + 1];
    }
    args.partial_num[chunk_row[kChunkPartialBase] + k] = sum_diff;
    args.partial_den[chunk_row[kChunkPartialBase] + k] = sum_mean;
  }
}

// Per entry, its chunks' partials in chunk order (the same function as on the CPU).
__global__ void reduce_entries_kernel(const int64_t* params, const int64_t* entries, const int64_t* chunks,
                                      const int64_t* param_chunk_begin, const double* partial_num,
                                      const double* partial_den, int64_t num_entries, double* entry_num,
                                      double* entry_den) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= num_entries) return;
  entry_num[e] = reduce_entry(params, entries, chunks, param_chunk_begin, partial_num, e);
  entry_den[e] = reduce_entry(params, entries, chunks, param_chunk_begin, partial_den, e);
}

// Per client, its entries in parameter order.
__global__ void reduce_clients_kernel(const int64_t* client_entry_begin, const int64_t* client_entries,
                                      const double* entry_num, const double* entry_den, int64_t num_clients,
                                      double* div_num, double* div_den) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_clients) return;
  double num = 0.0, den = 0.0;
  for (int64_t k = client_entry_begin[i]; k < client_entry_begin[i + 1]; ++k) {
    num += entry_num[client_entries[k]];
    den += entry_den[client_entries[k]];
  }
  div_num[i] = num;
  div_den[i] = den;
}

int64_t blocks_for(int64_t count, int64_t threads) { return max64(1, ceil_div(count, threads)); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_into_cuda(const at::Tensor& out, at::TensorList packed,
                                                                   const at::Tensor& params,
                                                                   const at::Tensor& entries,
                                                                   const at::Tensor& weights) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  const AggregatePlan plan = make_plan(params, entries, weights, kGpuTile, kGpuChunkElems);
  const int64_t num_entries = entries.size(0), num_clients = weights.size(0);
  const int64_t num_chunks = plan.chunks.size(0);
  const auto device = out.device();
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const auto double_options = at::TensorOptions().dtype(at::kDouble).device(device);

  at::Tensor addresses = at::empty({num_entries}, at::kLong);
  int64_t* address = addresses.data_ptr<int64_t>();
  for (int64_t e = 0; e < num_entries; ++e) address[e] = reinterpret_cast<int64_t>(packed[e].data_ptr());
  const at::Tensor params_d = params.to(device), entries_d = entries.to(device), chunks_d = plan.chunks.to(device);
  const at::Tensor chunk_begin_d = plan.param_chunk_begin.to(device), weight_d = plan.entry_weight.to(device);
  const at::Tensor client_begin_d = plan.client_entry_begin.to(device);
  const at::Tensor client_entries_d = plan.client_entries.to(device), addresses_d = addresses.to(device);
  at::Tensor partial_num = at::zeros({plan.num_partials}, double_options);
  at::Tensor partial_den = at::zeros({plan.num_partials}, double_options);
  at::Tensor chunk_covered = at::zeros({num_chunks}, long_options);
  at::Tensor div_num = at::zeros({num_clients}, double_options);
  at::Tensor div_den = at::zeros({num_clients}, double_options);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());

  if (num_chunks > 0) {
    // Norm slots in shared memory when they fit (opting in above 48 KiB), else in global scratch.
    const int64_t slot_bytes = plan.max_entries * kWarps * 2 * static_cast<int64_t>(sizeof(double));
    int max_optin = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device.index()));
    const bool in_shared = slot_bytes + 1024 <= max_optin;  // 1 KiB headroom for the static shared memory
    at::Tensor scratch;
    if (!in_shared) scratch = at::empty({num_chunks * plan.max_entries * kWarps * 2}, double_options);
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_into_cuda", [&] {
      CudaArgs args{params_d.data_ptr<int64_t>(),
                    entries_d.data_ptr<int64_t>(),
                    chunks_d.data_ptr<int64_t>(),
                    addresses_d.data_ptr<int64_t>(),
                    weight_d.data_ptr<double>(),
                    out.data_ptr(),
                    partial_num.data_ptr<double>(),
                    partial_den.data_ptr<double>(),
                    chunk_covered.data_ptr<int64_t>(),
                    in_shared ? nullptr : scratch.data_ptr<double>(),
                    plan.max_entries};
      const size_t shared_bytes = in_shared ? static_cast<size_t>(slot_bytes) : 0;
      if (shared_bytes > 48 * 1024)
        C10_CUDA_CHECK(cudaFuncSetAttribute(aggregate_chunks_kernel<scalar_t>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
      aggregate_chunks_kernel<scalar_t>
          <<<static_cast<unsigned>(num_chunks), kWarps * kWarpSize, shared_bytes, stream>>>(args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    at::Tensor entry_num = at::empty({num_entries}, double_options);
    at::Tensor entry_den = at::empty({num_entries}, double_options);
    if (num_entries > 0) {
      reduce_entries_kernel<<<blocks_for(num_entries, 256), 256, 0, stream>>>(
          params_d.data_ptr<int64_t>(), entries_d.data_ptr<int64_t>(), chunks_d.data_ptr<int64_t>(),
          chunk_begin_d.data_ptr<int64_t>(), partial_num.data_ptr<double>(), partial_den.data_ptr<double>(),
          num_entries, entry_num.data_ptr<double>(), entry_den.data_ptr<double>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (num_clients > 0) {
      reduce_clients_kernel<<<blocks_for(num_clients, 256), 256, 0, stream>>>(
          client_begin_d.data_ptr<int64_t>(), client_entries_d.data_ptr<int64_t>(), entry_num.data_ptr<double>(),
          entry_den.data_ptr<double>(), num_clients, div_num.data_ptr<double>(), div_den.data_ptr<double>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) { m.impl("aggregate_into", &aggregate_into_cuda); }

}  // namespace hasfl_ray
