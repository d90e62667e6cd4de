// CUDA implementation of hasfl_ray::aggregate_sparse_into: parameters whose clients hold index sets or masks
// (kind 1, see csrc/aggregate_sparse_host.h) beside slices and windows (kind 0), gathered in one pass.
//
// Same tables and host checks as the CPU op (prepare_sparse: row maps, per-tile prefixes of the column bitmask,
// here over tiles of kSparseTile = 128 columns; make_plan: the work split into chunks), packed into one pinned
// buffer (sparse_tables.h) and copied to the device with the call. The kernels are in sparse_kernels.cuh:
// sparse_tabled_kernel by default, sparse_serial_kernel (the first one, equal bit for bit) with
// HASFL_SPARSE_CUDA_KERNEL=serial (read at each call).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "cuda/sparse_kernels.cuh"
#include "cuda/sparse_tables.h"

namespace hasfl_ray {
namespace {

// Whether HASFL_SPARSE_CUDA_KERNEL asks for the serial kernel ("tabled" or unset: the tabled one); read at each call,
// so that one process can compare the two.
bool use_serial_kernel() {
  const char* name = std::getenv("HASFL_SPARSE_CUDA_KERNEL");
  if (name == nullptr || name[0] == '\0' || std::strcmp(name, "tabled") == 0) return false;
  TORCH_CHECK(std::strcmp(name, "serial") == 0, "HASFL_SPARSE_CUDA_KERNEL is '", name, "'; expected tabled or serial");
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sparse_into_cuda(
    const at::Tensor& out, at::TensorList packed, const at::Tensor& params, const at::Tensor& entries,
    const at::Tensor& weights, const at::Tensor& kinds, at::TensorList bits, const at::Tensor& rows,
    const at::Tensor& row_offsets) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.is_cuda(), "out must be a CUDA tensor for the CUDA kernel, got ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  const sparse_cuda::PackedTables tables = sparse_cuda::pack_tables(
      packed, params, entries, weights, kinds, bits, rows, row_offsets, kSparseTile, kSparseChunkElems,
      /*pinned=*/true);
  const sparse_cuda::TableOffsets& t = tables.at;
  const auto device = out.device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  at::Tensor table = at::empty({tables.host.numel()}, at::TensorOptions().dtype(at::kLong).device(device));
  table.copy_(tables.host, /*non_blocking=*/true);
  const int64_t* d = table.data_ptr<int64_t>();

  const int64_t slots = t.num_partials * kSparseWarps;
  at::Tensor sums = at::zeros({max64(2 * slots, 1)}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor chunk_covered = at::zeros({max64(t.num_chunks, 1)}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor div_num = at::zeros({t.num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor div_den = at::zeros({t.num_clients}, at::TensorOptions().dtype(at::kDouble).device(device));
  if (t.num_chunks > 0) {
    const bool serial = use_serial_kernel();
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_sparse_into_cuda", [&] {
      const SparseCudaArgs args =
          sparse_args(d, t, out.data_ptr(), sums.data_ptr<double>(), slots, chunk_covered.data_ptr<int64_t>());
      const unsigned blocks = static_cast<unsigned>(t.num_chunks);
      if (serial)
        sparse_serial_kernel<scalar_t><<<blocks, kSparseThreads, 0, stream>>>(args);
      else
        sparse_tabled_kernel<scalar_t><<<blocks, kSparseThreads, 0, stream>>>(args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  if (t.num_clients > 0) {
    sparse_reduce_kernel<<<static_cast<unsigned>(ceil_div(t.num_clients, 128)), 128, 0, stream>>>(
        d + t.params, d + t.entries, d + t.chunks, d + t.chunk_begin, d + t.client_begin, d + t.client_entries,
        sums.data_ptr<double>(), sums.data_ptr<double>() + slots, t.num_clients, div_num.data_ptr<double>(),
        div_den.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CUDA, m) { m.impl("aggregate_sparse_into", &aggregate_sparse_into_cuda); }

}  // namespace hasfl_ray
