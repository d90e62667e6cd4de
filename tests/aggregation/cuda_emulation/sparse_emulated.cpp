// The sparse CUDA op run on the CPU (emulate_cuda.h): the same host tables (csrc/cuda/sparse_tables.h) and the same
// kernel source (csrc/cuda/sparse_kernels.cuh) as aggregate_sparse_cuda.cu, on CPU tensors. Built by
// tests/aggregation/test_sparse_cuda_emulated.py with torch.utils.cpp_extension.
// The emulation's fibers switch by _longjmp between stacks; a fortified build's longjmp would take that for a
// corrupted stack and abort.
#undef _FORTIFY_SOURCE
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <vector>

#include "emulate_cuda.h"
// After the shim: the kernels' CUDA keywords are its macros.
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

}  // namespace
}  // namespace hasfl_ray

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("aggregate_sparse_into", &hasfl_ray::emulate_sparse,
        "The sparse CUDA op's kernel `kernel` (serial or tabled) emulated on CPU tensors");
}
