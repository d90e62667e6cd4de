// Host side of the dense CUDA op (aggregate_cuda.cu) and of its CPU emulation (tests/aggregation/cuda_emulation/):
// every table the kernels read in one int64 buffer (params, entries, chunks, per-parameter chunk starts, per-client
// entries, the entries' data addresses, whether each takes 16-byte loads, their weights, the work counter), and the
// call's plan sizes. Host code only (ATen); the kernels are in dense_kernels.cuh and dense_reduce.cuh.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "cuda/dense_common.cuh"

namespace hasfl_ray {
namespace dense_cuda {

using namespace layout;

struct DenseTables {
  at::Tensor host;  // int64 (words): pinned when asked
  int64_t params = 0, entries = 0, chunks = 0, chunk_begin = 0, client_begin = 0, client_entries = 0, data = 0,
          vector_ok = 0, weight = 0, counter = 0, words = 0;
  int64_t num_params = 0, num_entries = 0, num_clients = 0, num_chunks = 0, num_partials = 0, max_entries = 0;
  bool index32 = false;  // 32-bit index arithmetic: every parameter (so every packed tensor) and the entry count fit
};

inline DenseTables pack_dense_tables(at::TensorList packed, const at::Tensor& params, const at::Tensor& entries,
                                     const at::Tensor& weights, int64_t element_size, bool pinned) {
  DenseTables t;
  t.index32 = !HASFL_CUDA_FORCE_INDEX64 && entries.size(0) < kIndex32Limit;
  const int64_t* P = params.data_ptr<int64_t>();
  for (int64_t p = 0; p < params.size(0) && t.index32; ++p) {
    int64_t numel = 1;
    for (int d = 0; d < kMaxDims; ++d) numel *= P[p * kParamCols + kParamFull + d];
    t.index32 = numel < kIndex32Limit;
  }
  const AggregatePlan plan = make_plan(params, entries, weights, kGpuTile, kGpuChunkElems);
  t.num_params = params.size(0);
  t.num_entries = entries.size(0);
  t.num_clients = weights.size(0);
  t.num_chunks = plan.chunks.size(0);
  t.num_partials = plan.num_partials;
  t.max_entries = plan.max_entries;
  int64_t words = 0;
  const auto append = [&](int64_t count) {
    const int64_t start = words;
    words += count;
    return start;
  };
  t.params = append(t.num_params * kParamCols);
  t.entries = append(t.num_entries * kEntryCols);
  t.chunks = append(t.num_chunks * kChunkCols);
  t.chunk_begin = append(t.num_params + 1);
  t.client_begin = append(t.num_clients + 1);
  t.client_entries = append(t.num_entries);
  t.data = append(t.num_entries);
  t.vector_ok = append(t.num_entries);
  t.weight = append(t.num_entries);  // float64 bit patterns
  t.counter = append(1);
  t.words = words;
  t.host = at::empty({words}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  int64_t* h = t.host.data_ptr<int64_t>();
  const auto put = [&](int64_t at, const at::Tensor& from) {
    if (from.numel() > 0) std::memcpy(h + at, from.data_ptr(), from.numel() * sizeof(int64_t));
  };
  put(t.params, params);
  put(t.entries, entries);
  put(t.chunks, plan.chunks);
  put(t.chunk_begin, plan.param_chunk_begin);
  put(t.client_begin, plan.client_entry_begin);
  put(t.client_entries, plan.client_entries);
  put(t.weight, plan.entry_weight);  // same size as int64
  h[t.counter] = 0;
  const int64_t* E = entries.data_ptr<int64_t>();
  const int64_t vector_elems = 16 / element_size;
  for (int64_t e = 0; e < t.num_entries; ++e) {
    const int64_t* entry = E + e * kEntryCols;
    const int64_t last = P[entry[kEntryParam] * kParamCols + kParamNdim] - 1;
    const int64_t address = reinterpret_cast<int64_t>(packed[e].data_ptr());
    h[t.data + e] = address;
    // Rows start at local_row * width: 16-byte aligned for every row when the base is and width is a
    // multiple of the vector; and a window that does not wrap (offset 0) maps column c to local c.
    h[t.vector_ok + e] = address % 16 == 0 && entry[kEntryPacked + last] % vector_elems == 0 &&
                         entry[kEntryOffset + last] == 0;
  }
  return t;
}

// The chunk kernel's arguments over a copy `d` of the tables (its counter zero), with the call's buffers.
inline CudaArgs dense_args(const int64_t* d, int64_t* d_mutable, const DenseTables& t, void* out, double* partial_num,
                           double* partial_den, int64_t* chunk_covered, int64_t shared_slots) {
  return CudaArgs{d + t.params,
                  d + t.entries,
                  d + t.chunks,
                  d + t.chunk_begin,
                  d + t.data,
                  d + t.vector_ok,
                  reinterpret_cast<const double*>(d + t.weight),
                  out,
                  partial_num,
                  partial_den,
                  chunk_covered,
                  reinterpret_cast<unsigned long long*>(d_mutable + t.counter),
                  t.num_chunks,
                  shared_slots};
}

}  // namespace dense_cuda
}  // namespace hasfl_ray
