// CUDA implementation of hasfl_ray::aggregate_into: persistent blocks, a block per item, entries split
// over its warps, 16-byte loads.
//
// Same descriptor, same index arithmetic (csrc/aggregate_layout.h), same work split into chunks
// (make_plan with kGpuTile = 128 columns, kGpuChunkElems = 1024 coordinates), same definition of the
// result. Mapping:
//   grid:   as many blocks of 256 threads as fit on the card at once (occupancy x SM count); each block
//           takes the next chunk from an integer work counter until none is left (the counter only hands
//           out work: every chunk's result is the same whichever block computes it).
//   item:   one row and a tile of <= 128 columns of its last dim, done by the whole block. Lane l of every
//           warp owns columns c0 + 4l .. c0 + 4l + 3; warp w takes the item's entries w, w + 8, w + 16, ...
//           (kUnroll of them in flight at once), each a 16-byte load (float4, or two double2) where the
//           entry's rows are 16-byte aligned and the 4 columns lie inside its window, else 4 scalar loads.
//   pass 1: per warp and column, the weighted sum and the covering weight of its entries, in entry order;
//           the 8 warps' sums are added in warp order through shared memory; mean = acc / den (0 where no
//           entry covers), written to out (consecutive threads, consecutive columns) and to shared memory.
//   pass 2: each warp re-reads the same entries (the bytes it has just read, from L1/L2), per entry a warp
//           sum (fixed xor-shuffle tree) of (x - mean)^2 and mean^2 over its columns, added by lane 0 to
//           the entry's norm slot. An entry always belongs to the same warp, so a slot has one writer.
//   chunk:  slots (shared memory, or for parameters with > kMaxSharedSlots entries the partials in global
//           memory) start at 0 and are written as this chunk's partials, entry-major per parameter.
//   then:   a block per entry sums its chunks' partials (fixed strided split + fixed tree), a thread per
//           client its entries in parameter order.
//   index:  row, column and item arithmetic in 32 bits where every parameter has < 2^31 elements (the usual
//           case: no register spills at 64 registers), else in 64 bits: two instantiations, chosen per call.
// No float atomics: deterministic from run to run on a given GPU; not bit-identical to the CPU kernel
// (other summation order). All tables go to the device in one copy from pinned memory (dense_tables.h). The kernels
// are in dense_common.cuh, dense_kernels.cuh and dense_reduce.cuh, which tests/aggregation/cuda_emulation/ also
// runs on the CPU; this file is the op's host side.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // not ATen/cuda/CUDAContext.h: that one needs the cuSPARSE/cuBLAS headers
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <tuple>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "cuda/dense_kernels.cuh"
#include "cuda/dense_reduce.cuh"
#include "cuda/dense_tables.h"

namespace hasfl_ray {
namespace {

int64_t blocks_for(int64_t count, int64_t threads) { return max64(1, ceil_div(count, threads)); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_into_cuda(const at::Tensor& out, at::TensorList packed,
                                                                   const at::Tensor& params,
                                                                   const at::Tensor& entries,
                                                                   const at::Tensor& weights) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  // Every table the kernels read, in one pinned int64 buffer, copied to the device at once.
  const dense_cuda::DenseTables t =
      dense_cuda::pack_dense_tables(packed, params, entries, weights, out.element_size(), /*pinned=*/true);
  const auto device = out.device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  at::Tensor tables = at::empty({t.words}, at::TensorOptions().dtype(at::kLong).device(device));
  tables.copy_(t.host, /*non_blocking=*/true);
  const int64_t* d = tables.data_ptr<int64_t>();

  // Partials, then per-entry sums; each written in full before it is read.
  at::Tensor sums = at::empty({2 * t.num_partials + 2 * t.num_entries},
                              at::TensorOptions().dtype(at::kDouble).device(device));
  double* partial_num = sums.data_ptr<double>();
  double* partial_den = partial_num + t.num_partials;
  double* entry_num = partial_den + t.num_partials;
  double* entry_den = entry_num + t.num_entries;
  at::Tensor chunk_covered = at::empty({t.num_chunks}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor div_num = at::empty({t.num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor div_den = at::empty({t.num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));

  if (t.num_chunks > 0) {
    const int64_t shared_slots = min64(t.max_entries, kMaxSharedSlots);
    const size_t shared_bytes = static_cast<size_t>(2 * shared_slots) * sizeof(double);  // <= 24 KiB: no opt-in
    int sm_count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device.index()));
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_into_cuda", [&] {
      const CudaArgs args = dense_cuda::dense_args(d, tables.data_ptr<int64_t>(), t, out.data_ptr(), partial_num,
                                                   partial_den, chunk_covered.data_ptr<int64_t>(), shared_slots);
      const auto launch = [&](auto kernel) {
        int per_sm = 0;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared_bytes));
        const int64_t grid = min64(t.num_chunks, max64(1, static_cast<int64_t>(per_sm) * sm_count));
        kernel<<<static_cast<unsigned>(grid), kThreads, shared_bytes, stream>>>(args);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (t.index32)
        launch(aggregate_chunks_kernel<scalar_t, int32_t>);
      else
        launch(aggregate_chunks_kernel<scalar_t, int64_t>);
    });
  }
  if (t.num_entries > 0) {
    reduce_entries_kernel<<<static_cast<unsigned>(t.num_entries), kReduceThreads, 0, stream>>>(
        d + t.params, d + t.entries, d + t.chunks, d + t.chunk_begin, partial_num, partial_den, entry_num,
        entry_den);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (t.num_clients > 0) {
    reduce_clients_kernel<<<static_cast<unsigned>(blocks_for(t.num_clients, 256)), 256, 0, stream>>>(
        d + t.client_begin, d + t.client_entries, entry_num, entry_den, t.num_clients, div_num.data_ptr<double>(),
        div_den.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) { m.impl("aggregate_into", &aggregate_into_cuda); }

}  // namespace hasfl_ray
