// Host side of the sparse CUDA op (aggregate_sparse_cuda.cu) and of its CPU emulation
// (tests/aggregation/cuda_emulation/): the op's tables packed into one int64 buffer, the kernels' arguments read
// from it. Host code only (ATen); the kernels themselves are in sparse_kernels.cuh.
//
// Buffer: the int64 tables (params, entries, chunks, per-parameter chunk starts, per-client entries, kinds, the
// entries' data addresses and weights, where each bitmask starts, the row maps' and tile prefixes' starts, the tile
// prefixes), then the row maps (int32) and the bitmasks (bytes), each 16-byte aligned. Bitmasks arrive on the host
// (they are read there anyway); each entry's is padded to a multiple of 16 bytes so that a tile's 16 bytes can
// always be read.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "aggregate_sparse_host.h"

namespace hasfl_ray {
namespace sparse_cuda {

using namespace layout;

// Where each table starts in the buffer (int64 words), and the plan's sizes.
struct TableOffsets {
  int64_t params = 0, entries = 0, chunks = 0, chunk_begin = 0, client_begin = 0, client_entries = 0, kinds = 0,
          data = 0, weight = 0, bits_at = 0, map_begin = 0, prefix_begin = 0, prefix = 0, row_map = 0, bits = 0;
  int64_t num_params = 0, num_entries = 0, num_clients = 0, num_chunks = 0, num_partials = 0, words = 0;
};

// Each sparse (kind 1) entry's bitmask on the host (null and 0 for a dense entry), checked: the sparse ops' CUDA
// host sides read them there and copy them to the device with their tables.
struct HostBitmasks {
  std::vector<const uint8_t*> ptr;
  std::vector<int64_t> len;
  std::vector<int64_t> at;  // where each starts in the device copy: padded to a multiple of 16 bytes, plus 16 (room
                            // for a tile's 16 bytes past the last full one)
  int64_t total = 0;        // the device copy's bytes
};

// Where each host bitmask (null: none) starts in the device copy, into `at`; returns the copy's bytes.
inline int64_t bitmask_offsets(const std::vector<const uint8_t*>& ptr, const std::vector<int64_t>& len,
                               std::vector<int64_t>& at) {
  at.assign(ptr.size(), 0);
  int64_t total = 0;
  for (size_t e = 0; e < ptr.size(); ++e) {
    if (ptr[e] == nullptr) continue;
    at[e] = total;
    total += ceil_div(len[e], 16) * 16 + 16;
  }
  return total;
}

inline HostBitmasks host_bitmasks(const at::Tensor& entries, const at::Tensor& kinds, int64_t num_params,
                                  at::TensorList bits) {
  const int64_t num_entries = entries.size(0);
  TORCH_CHECK(static_cast<int64_t>(bits.size()) == num_entries, "bits has ", bits.size(),
              " tensors but entries has ", num_entries, " rows");
  TORCH_CHECK(kinds.device().is_cpu() && kinds.scalar_type() == at::kLong && kinds.dim() == 1 &&
                  kinds.size(0) == num_params && kinds.is_contiguous(),
              "kinds must be a contiguous int64 CPU tensor of shape (", num_params, ")");
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  HostBitmasks masks{std::vector<const uint8_t*>(num_entries, nullptr), std::vector<int64_t>(num_entries, 0),
                     std::vector<int64_t>(num_entries, 0), 0};
  for (int64_t e = 0; e < num_entries; ++e) {
    if (K[E[e * kEntryCols + kEntryParam]] == 0) continue;
    TORCH_CHECK(bits[e].scalar_type() == at::kByte && bits[e].device().is_cpu() && bits[e].is_contiguous() &&
                    bits[e].dim() == 1,
                "bits[", e, "] must be a contiguous 1-D uint8 CPU tensor (the CUDA kernel copies it to the device)");
    masks.ptr[e] = bits[e].data_ptr<uint8_t>();
    masks.len[e] = bits[e].numel();
  }
  masks.total = bitmask_offsets(masks.ptr, masks.len, masks.at);
  return masks;
}

struct PackedTables {
  at::Tensor host;  // int64 (words): pinned when asked
  TableOffsets at;
};

// The op's tables for `tile`-column tiles and chunks of about `chunk_elems` coordinates. Checks what the host
// checks (check_aggregate_args has run), including each sparse entry's bitmask.
inline PackedTables pack_tables(at::TensorList packed, const at::Tensor& params, const at::Tensor& entries,
                                const at::Tensor& weights, const at::Tensor& kinds, at::TensorList bits,
                                const at::Tensor& rows, const at::Tensor& row_offsets, int64_t tile,
                                int64_t chunk_elems, bool pinned) {
  TableOffsets t;
  t.num_params = params.size(0);
  t.num_entries = entries.size(0);
  t.num_clients = weights.size(0);
  const int64_t num_entries = t.num_entries;
  const HostBitmasks masks = host_bitmasks(entries, kinds, t.num_params, bits);
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  const std::vector<const uint8_t*>& bits_ptr = masks.ptr;
  const std::vector<int64_t>& bits_len = masks.len;
  const std::vector<int64_t>& bits_at = masks.at;
  const int64_t bits_total = masks.total;
  const SparsePrep prep = prepare_sparse(params, entries, kinds, bits_ptr, bits_len, rows, row_offsets, tile);
  const AggregatePlan plan = make_plan(params, entries, weights, tile, chunk_elems);
  t.num_chunks = plan.chunks.size(0);
  t.num_partials = plan.num_partials;

  t.params = 0;
  t.entries = t.params + t.num_params * kParamCols;
  t.chunks = t.entries + num_entries * kEntryCols;
  t.chunk_begin = t.chunks + t.num_chunks * kChunkCols;
  t.client_begin = t.chunk_begin + t.num_params + 1;
  t.client_entries = t.client_begin + t.num_clients + 1;
  t.kinds = t.client_entries + num_entries;
  t.data = t.kinds + t.num_params;
  t.weight = t.data + num_entries;
  t.bits_at = t.weight + num_entries;
  t.map_begin = t.bits_at + num_entries;
  t.prefix_begin = t.map_begin + num_entries * kMaxDims;
  t.prefix = t.prefix_begin + num_entries;
  t.row_map = ceil_div(t.prefix + static_cast<int64_t>(prep.tile_prefix.size()), 2) * 2;
  t.bits = t.row_map + ceil_div(static_cast<int64_t>(prep.row_map.size()), 4) * 2;  // int32 pairs, 16-byte runs
  t.words = max64(t.bits + ceil_div(bits_total, 16) * 2, 2);

  at::Tensor host = at::zeros({t.words}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  int64_t* h = host.data_ptr<int64_t>();
  const auto put = [&](int64_t at, const void* from, int64_t words) {
    if (words > 0) std::memcpy(h + at, from, words * sizeof(int64_t));
  };
  put(t.params, params.data_ptr<int64_t>(), t.num_params * kParamCols);
  put(t.entries, E, num_entries * kEntryCols);
  put(t.chunks, plan.chunks.data_ptr<int64_t>(), t.num_chunks * kChunkCols);
  put(t.chunk_begin, plan.param_chunk_begin.data_ptr<int64_t>(), t.num_params + 1);
  put(t.client_begin, plan.client_entry_begin.data_ptr<int64_t>(), t.num_clients + 1);
  put(t.client_entries, plan.client_entries.data_ptr<int64_t>(), num_entries);
  put(t.kinds, K, t.num_params);
  put(t.weight, plan.entry_weight.data_ptr<double>(), num_entries);  // float64 bit patterns
  put(t.bits_at, bits_at.data(), num_entries);
  put(t.map_begin, prep.row_map_begin.data(), num_entries * kMaxDims);
  put(t.prefix_begin, prep.prefix_begin.data(), num_entries);
  put(t.prefix, prep.tile_prefix.data(), static_cast<int64_t>(prep.tile_prefix.size()));
  for (int64_t e = 0; e < num_entries; ++e) h[t.data + e] = reinterpret_cast<int64_t>(packed[e].data_ptr());
  if (!prep.row_map.empty()) std::memcpy(h + t.row_map, prep.row_map.data(), prep.row_map.size() * sizeof(int32_t));
  uint8_t* host_bits = reinterpret_cast<uint8_t*>(h + t.bits);
  for (int64_t e = 0; e < num_entries; ++e)
    if (bits_ptr[e] != nullptr && bits_len[e] > 0) std::memcpy(host_bits + bits_at[e], bits_ptr[e], bits_len[e]);
  return PackedTables{host, t};
}

}  // namespace sparse_cuda
}  // namespace hasfl_ray
