// Host-side checks and work plan of the fused aggregation, shared by the CPU and CUDA implementations.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "aggregate_layout.h"

namespace hasfl_ray {

// What the kernels need besides the descriptor tables; all CPU tensors.
struct AggregatePlan {
  at::Tensor chunks;             // int64 (num_chunks, kChunkCols)
  at::Tensor param_chunk_begin;  // int64 (P + 1): chunks of parameter p are [begin[p], begin[p + 1])
  at::Tensor entry_weight;       // float64 (E): the weight of each entry's client
  at::Tensor weight_prefix;      // float64 (E + P): per parameter p, at entry_begin[p] + p + k, the sum of
                                 // the weights of its first k entries (the denominator when nested)
  at::Tensor client_entry_begin; // int64 (N + 1): client i's entries are client_entries[begin[i]:begin[i+1]]
  at::Tensor client_entries;     // int64 (E), in parameter order per client
  int64_t num_partials = 0;      // per-entry norm partials over all chunks
  int64_t max_entries = 0;       // most entries of any one parameter
};

// Re-checks everything the kernels rely on for memory safety. Python validates first with full
// sentences; these checks keep a direct call of the op from crashing the interpreter.
inline void check_aggregate_args(const at::TensorList& packed, const at::Tensor& params, const at::Tensor& entries,
                                 const at::Tensor& weights, const at::Tensor& out) {
  using namespace layout;
  TORCH_CHECK(params.device().is_cpu() && params.scalar_type() == at::kLong && params.dim() == 2 &&
                  params.size(1) == kParamCols && params.is_contiguous(),
              "params must be a contiguous int64 CPU tensor of shape (P, ", kParamCols, "), got ", params.sizes(),
              " ", params.scalar_type(), " on ", params.device());
  TORCH_CHECK(entries.device().is_cpu() && entries.scalar_type() == at::kLong && entries.dim() == 2 &&
                  entries.size(1) == kEntryCols && entries.is_contiguous(),
              "entries must be a contiguous int64 CPU tensor of shape (E, ", kEntryCols, "), got ", entries.sizes(),
              " ", entries.scalar_type(), " on ", entries.device());
  TORCH_CHECK(weights.device().is_cpu() && weights.scalar_type() == at::kDouble && weights.dim() == 1 &&
                  weights.is_contiguous(),
              "weights must be a contiguous 1-D float64 CPU tensor, got ", weights.sizes(), " ",
              weights.scalar_type(), " on ", weights.device());
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble,
              "out must be float32 or float64, got ", out.scalar_type());
  TORCH_CHECK(out.dim() == 1 && out.is_contiguous(), "out must be a contiguous 1-D tensor, got shape ", out.sizes());
  const int64_t num_params = params.size(0), num_entries = entries.size(0), num_clients = weights.size(0);
  TORCH_CHECK(static_cast<int64_t>(packed.size()) == num_entries, "packed has ", packed.size(),
              " tensors but entries has ", num_entries, " rows; expected one tensor per entry");
  const double* w = weights.data_ptr<double>();
  for (int64_t i = 0; i < num_clients; ++i)
    TORCH_CHECK(std::isfinite(w[i]) && w[i] > 0, "weights[", i, "] is ", w[i], "; expected finite and positive");
  const int64_t* P = params.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  int64_t expected_begin = 0;
  for (int64_t p = 0; p < num_params; ++p) {
    const int64_t* param = P + p * kParamCols;
    const int64_t ndim = param[kParamNdim];
    TORCH_CHECK(ndim >= 1 && ndim <= kMaxDims, "params[", p, "] has ndim ", ndim, "; expected 1 to ", kMaxDims);
    int64_t numel = 1;
    for (int64_t d = 0; d < kMaxDims; ++d) {
      const int64_t full = param[kParamFull + d];
      TORCH_CHECK(full >= 0 && (d < ndim || full == 1), "params[", p, "] has full size ", full, " in dim ", d);
      numel *= full;
    }
    const int64_t offset = param[kParamOutOffset];
    TORCH_CHECK(offset >= 0 && offset + numel <= out.numel(), "params[", p, "] writes [", offset, ", ",
                offset + numel, ") but out has ", out.numel(), " elements");
    const int64_t begin = param[kParamEntryBegin], end = param[kParamEntryEnd];
    TORCH_CHECK(begin == expected_begin && end >= begin && end <= num_entries, "params[", p, "] has entries [",
                begin, ", ", end, "); expected them to start at ", expected_begin, " and end by ", num_entries);
    expected_begin = end;
    for (int64_t e = begin; e < end; ++e) {
      const int64_t* entry = E + e * kEntryCols;
      TORCH_CHECK(entry[kEntryParam] == p, "entries[", e, "] names parameter ", entry[kEntryParam], "; expected ", p);
      TORCH_CHECK(entry[kEntryClient] >= 0 && entry[kEntryClient] < num_clients, "entries[", e, "] names client ",
                  entry[kEntryClient], " but weights has ", num_clients);
      int64_t packed_numel = 1;
      for (int64_t d = 0; d < kMaxDims; ++d) {
        const int64_t size = entry[kEntryPacked + d], off = entry[kEntryOffset + d], full = param[kParamFull + d];
        TORCH_CHECK(size >= 0 && size <= full && off >= 0 && (off < full || (full == 0 && off == 0)),
                    "entries[", e, "] has packed size ", size, " and offset ", off, " in dim ", d,
                    " of a dim of size ", full);
        packed_numel *= size;
      }
      const at::Tensor& t = packed[e];
      TORCH_CHECK(t.scalar_type() == out.scalar_type(), "packed[", e, "] has dtype ", t.scalar_type(),
                  " but out has ", out.scalar_type());
      TORCH_CHECK(t.device() == out.device(), "packed[", e, "] is on ", t.device(), " but out is on ", out.device());
      TORCH_CHECK(t.is_contiguous(), "packed[", e, "] must be contiguous");
      TORCH_CHECK(t.numel() == packed_numel, "packed[", e, "] has ", t.numel(), " elements but its entry says ",
                  packed_numel);
      if (param[kParamNested] && e > begin) {
        const int64_t* prev = entry - kEntryCols;
        for (int64_t d = 0; d < kMaxDims; ++d)
          TORCH_CHECK(entry[kEntryPacked + d] <= prev[kEntryPacked + d] && entry[kEntryOffset + d] == prev[kEntryOffset + d],
                      "params[", p, "] is marked nested but entries[", e, "] is not inside entries[", e - 1, "]");
      }
    }
  }
  TORCH_CHECK(expected_begin == num_entries, "params cover entries [0, ", expected_begin, ") but there are ",
              num_entries);
}

// Chunks, entry weights, prefix sums and the client->entries index. `tile` and `chunk_elems` fix the
// work split (and hence the summation order): they depend on the device kind only.
inline AggregatePlan make_plan(const at::Tensor& params, const at::Tensor& entries, const at::Tensor& weights,
                               int64_t tile, int64_t chunk_elems) {
  using namespace layout;
  AggregatePlan plan;
  const int64_t num_params = params.size(0), num_entries = entries.size(0), num_clients = weights.size(0);
  const int64_t* P = params.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  const double* w = weights.data_ptr<double>();
  std::vector<int64_t> chunks;
  plan.param_chunk_begin = at::empty({num_params + 1}, at::kLong);
  int64_t* chunk_begin = plan.param_chunk_begin.data_ptr<int64_t>();
  int64_t partial_base = 0;
  for (int64_t p = 0; p < num_params; ++p) {
    const int64_t* param = P + p * kParamCols;
    chunk_begin[p] = static_cast<int64_t>(chunks.size()) / kChunkCols;
    const int64_t items = num_items(param, tile), per_chunk = items_per_chunk(param, tile, chunk_elems);
    const int64_t count = param[kParamEntryEnd] - param[kParamEntryBegin];
    plan.max_entries = max64(plan.max_entries, count);
    for (int64_t begin = 0; begin < items; begin += per_chunk) {
      chunks.insert(chunks.end(), {p, begin, min64(begin + per_chunk, items), partial_base});
      partial_base += count;
    }
  }
  const int64_t num_chunks = static_cast<int64_t>(chunks.size()) / kChunkCols;
  chunk_begin[num_params] = num_chunks;
  plan.num_partials = partial_base;
  plan.chunks = at::empty({num_chunks, kChunkCols}, at::kLong);
  std::copy(chunks.begin(), chunks.end(), plan.chunks.data_ptr<int64_t>());

  plan.entry_weight = at::empty({num_entries}, at::kDouble);
  plan.weight_prefix = at::empty({num_entries + num_params}, at::kDouble);
  double* ew = plan.entry_weight.data_ptr<double>();
  double* prefix = plan.weight_prefix.data_ptr<double>();
  for (int64_t p = 0; p < num_params; ++p) {
    const int64_t begin = P[p * kParamCols + kParamEntryBegin], end = P[p * kParamCols + kParamEntryEnd];
    double sum = 0.0;
    prefix[begin + p] = 0.0;
    for (int64_t e = begin; e < end; ++e) {
      ew[e] = w[E[e * kEntryCols + kEntryClient]];
      sum += ew[e];
      prefix[e + p + 1] = sum;
    }
  }

  plan.client_entry_begin = at::zeros({num_clients + 1}, at::kLong);
  plan.client_entries = at::empty({num_entries}, at::kLong);
  int64_t* cbegin = plan.client_entry_begin.data_ptr<int64_t>();
  int64_t* centries = plan.client_entries.data_ptr<int64_t>();
  for (int64_t e = 0; e < num_entries; ++e) ++cbegin[E[e * kEntryCols + kEntryClient] + 1];
  for (int64_t i = 0; i < num_clients; ++i) cbegin[i + 1] += cbegin[i];
  std::vector<int64_t> fill(cbegin, cbegin + num_clients);
  for (int64_t e = 0; e < num_entries; ++e) centries[fill[E[e * kEntryCols + kEntryClient]]++] = e;
  return plan;
}

// The private ops' own arguments (both devices): the per-client clip bounds (float64 on the CPU, > 0, inf: no
// clipping), the noise's standard deviation and the expected participant count; returns the bounds' pointer.
inline const double* check_private_args(const at::Tensor& bounds, int64_t num_clients, double noise_std,
                                        std::optional<double> expected) {
  TORCH_CHECK(bounds.device().is_cpu() && bounds.scalar_type() == at::kDouble && bounds.dim() == 1 &&
                  bounds.is_contiguous() && bounds.size(0) == num_clients,
              "bounds must be a contiguous float64 CPU tensor of shape (", num_clients, "), got ", bounds.sizes(), " ",
              bounds.scalar_type(), " on ", bounds.device());
  const double* bound = bounds.data_ptr<double>();
  for (int64_t i = 0; i < num_clients; ++i)
    TORCH_CHECK(bound[i] > 0, "bounds[", i, "] is ", bound[i], "; expected positive (inf: no clipping)");
  TORCH_CHECK(std::isfinite(noise_std) && noise_std >= 0, "noise_std is ", noise_std, "; expected finite and >= 0");
  TORCH_CHECK(!expected.has_value() || (std::isfinite(*expected) && *expected > 0), "expected is ",
              expected.value_or(0.0), "; expected finite and positive");
  return bound;
}

}  // namespace hasfl_ray
