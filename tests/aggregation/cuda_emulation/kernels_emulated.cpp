// The CUDA ops run on the CPU (emulate_cuda.h), on CPU tensors: the dense op with aggregate_cuda.cu's tables
// (csrc/cuda/dense_tables.h) and kernels (dense_kernels.cuh, dense_reduce.cuh), the sparse op with
// aggregate_sparse_cuda.cu's (sparse_tables.h, sparse_kernels.cuh). Built by tests/aggregation/cuda_emulation.py
// with torch.utils.cpp_extension.
// The emulation's fibers switch by _longjmp between stacks; a fortified build's longjmp would take that for a
// corrupted stack and abort.
#undef _FORTIFY_SOURCE
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <vector>

#include "emulate_cuda.h"
// After the shim: the kernels' CUDA keywords are its macros.
#include "cuda/dense_kernels.cuh"
#include "cuda/dense_reduce.cuh"
#include "cuda/dense_tables.h"
#include "cuda/sparse_kernels.cuh"
#include "cuda/sparse_tables.h"

namespace hasfl_ray {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> emulate_sparse(const std::string& kernel, at::Tensor out,
                                                              std::vector<at::Tensor> packed, at::Tensor params,
                                                              at::Tensor entries, at::Tensor weights,
                                                              at::Tensor kinds, std::vector<at::Tensor> bits,
                                                              at::Tensor rows, at::Tensor row_offsets) {
  TORCH_CHECK(kernel == "serial" || kernel == "tabled", "kernel is '", kernel, "'; expected serial or tabled");
  check_aggregate_args(packed, params, entries, weights, out);
  const sparse_cuda::PackedTables tables = sparse_cuda::pack_tables(
      packed, params, entries, weights, kinds, bits, rows, row_offsets, kSparseTile, kSparseChunkElems, false);
  const sparse_cuda::TableOffsets& t = tables.at;
  const int64_t* d = tables.host.data_ptr<int64_t>();
  const int64_t slots = t.num_partials * kSparseWarps;
  at::Tensor sums = at::zeros({max64(2 * slots, 1)}, at::kDouble);
  at::Tensor chunk_covered = at::zeros({max64(t.num_chunks, 1)}, at::kLong);
  at::Tensor div_num = at::zeros({t.num_clients}, at::kDouble), div_den = at::zeros({t.num_clients}, at::kDouble);
  const SparseCudaArgs args =
      sparse_args(d, t, out.data_ptr(), sums.data_ptr<double>(), slots, chunk_covered.data_ptr<int64_t>());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "emulate_sparse", [&] {
    if (kernel == "serial")
      emu_launch(static_cast<unsigned>(t.num_chunks), kSparseThreads, [&] { sparse_serial_kernel<scalar_t>(args); });
    else
      emu_launch(static_cast<unsigned>(t.num_chunks), kSparseThreads, [&] { sparse_tabled_kernel<scalar_t>(args); });
  });
  double* num = sums.data_ptr<double>();
  emu_launch_serial(static_cast<unsigned>(ceil_div(t.num_clients, 128)), 128, [&] {
    sparse_reduce_kernel(d + t.params, d + t.entries, d + t.chunks, d + t.chunk_begin, d + t.client_begin,
                         d + t.client_entries, num, num + slots, t.num_clients, div_num.data_ptr<double>(),
                         div_den.data_ptr<double>());
  });
  return {div_num, div_den, chunk_covered.sum()};
}

// aggregate_into_cuda's launches: the chunk kernel on `blocks` persistent blocks (the first takes every chunk the
// counter hands out, the others find none left), a block per entry, a thread per client.
std::tuple<at::Tensor, at::Tensor, at::Tensor> emulate_dense(at::Tensor out, std::vector<at::Tensor> packed,
                                                             at::Tensor params, at::Tensor entries,
                                                             at::Tensor weights, int64_t blocks) {
  TORCH_CHECK(blocks >= 1, "blocks is ", blocks, "; expected >= 1");
  check_aggregate_args(packed, params, entries, weights, out);
  const dense_cuda::DenseTables t =
      dense_cuda::pack_dense_tables(packed, params, entries, weights, out.element_size(), false);
  int64_t* d = t.host.data_ptr<int64_t>();
  at::Tensor sums = at::empty({2 * t.num_partials + 2 * t.num_entries}, at::kDouble);
  double* partial_num = sums.data_ptr<double>();
  double* partial_den = partial_num + t.num_partials;
  double* entry_num = partial_den + t.num_partials;
  double* entry_den = entry_num + t.num_entries;
  at::Tensor chunk_covered = at::empty({t.num_chunks}, at::kLong);
  at::Tensor div_num = at::empty({t.num_clients}, at::kDouble), div_den = at::empty({t.num_clients}, at::kDouble);
  if (t.num_chunks > 0) {
    const int64_t shared_slots = min64(t.max_entries, kMaxSharedSlots);
    emu_block.dynamic.assign(2 * shared_slots, 0.0);
    const CudaArgs args = dense_cuda::dense_args(d, d, t, out.data_ptr(), partial_num, partial_den,
                                                 chunk_covered.data_ptr<int64_t>(), shared_slots);
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "emulate_dense", [&] {
      const unsigned grid = static_cast<unsigned>(min64(t.num_chunks, blocks));
      if (t.index32)
        emu_launch(grid, kThreads, [&] { aggregate_chunks_kernel<scalar_t, int32_t>(args); });
      else
        emu_launch(grid, kThreads, [&] { aggregate_chunks_kernel<scalar_t, int64_t>(args); });
    });
  }
  if (t.num_entries > 0)
    emu_launch(static_cast<unsigned>(t.num_entries), kReduceThreads, [&] {
      reduce_entries_kernel(d + t.params, d + t.entries, d + t.chunks, d + t.chunk_begin, partial_num, partial_den,
                            entry_num, entry_den);
    });
  if (t.num_clients > 0)
    emu_launch_serial(static_cast<unsigned>(ceil_div(t.num_clients, 256)), 256, [&] {
      reduce_clients_kernel(d + t.client_begin, d + t.client_entries, entry_num, entry_den, t.num_clients,
                            div_num.data_ptr<double>(), div_den.data_ptr<double>());
    });
  return {div_num, div_den, chunk_covered.sum()};
}

}  // namespace
}  // namespace hasfl_ray

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("aggregate_sparse_into", &hasfl_ray::emulate_sparse,
        "The sparse CUDA op's kernel `kernel` (serial or tabled) emulated on CPU tensors");
  m.def("aggregate_into", &hasfl_ray::emulate_dense,
        "The dense CUDA op emulated on CPU tensors, its chunk kernel on `blocks` persistent blocks");
}
