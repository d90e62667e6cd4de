// CPU (OpenMP) implementation of hasfl_ray::aggregate_into: one pass over the client bytes.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HASFL_HAVE_AVX2_BUILD 1
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"
#include "aggregate_sparse_host.h"

namespace hasfl_ray {
namespace {

using namespace layout;

// Work split of the CPU kernel (fixes the summation order, hence part of the result's definition).
// A tile of 1024 columns reads 4 KiB runs per client (longer runs stream faster from DRAM); 50 clients'
// tiles (200 KiB in float32) stay in L2 between the two passes, more spill to L3 (Zen 3: 512 KiB L2).
constexpr int64_t kCpuTile = 1024;
constexpr int64_t kCpuChunkElems = 32768;

struct CpuArgs {
  const int64_t* params;
  const int64_t* entries;
  const int64_t* chunks;
  const void* const* data;     // per entry: its packed tensor
  const double* entry_weight;  // per entry
  const double* weight_prefix; // see AggregatePlan
  void* out;
  double* partial_num;
  double* partial_den;
  int64_t* chunk_covered;
};

// The AVX-512 sparse kernel's state of one entry covering the current row (cpu/aggregate_sparse_pull.h).
struct alignas(64) PullEntry {
  double lanes[32];       // its norm lanes of the current item: (x - mean)^2 then mean^2, 16 columns (mod 16) each
  const void* run;        // where its packed run of the current tile starts
  const void* at;         // where the values of the current 64 columns start
  const void* limit;      // one past its packed tensor
  std::ptrdiff_t ahead;   // where the next item's run starts, in values past this one's (prefetched)
  const uint8_t* bits;    // its bitmask at the current tile's first column
  uint64_t quad;          // the bits of the current 64 columns
  double weight;
};

struct alignas(64) Line {
  double v[8];
};

struct SparseScratch {
  double* acc;          // kCpuTile + 16 (portable build)
  double* den;          // kCpuTile + 16 (portable build)
  double* mean;         // kCpuTile + 16 (portable build)
  int64_t* row_entry;   // max_entries: entries covering the current row
  int64_t* row_start;   // max_entries: element offset of that row inside the entry's packed tensor
  PullEntry* pull;      // max_entries (AVX-512 build): row entry k's state
  double* kept;         // max_entries x 64, 64-byte aligned (AVX-512 build): row entry k's 64 columns, expanded
                        // (float32: as 64 floats at k x 32 doubles, the buffer's first half: kKeptWord)
  int64_t* next_entry;  // max_entries: entries covering the next row (prefetch)
  int64_t* next_start;  // max_entries
  int64_t* next_lines;  // max_entries (AVX-512 build): cache lines of its first tile prefetched per 64 columns
};

// The kernel's 4-double vectors are passed between inline functions only; GCC's note that their ABI
// differs with and without AVX does not concern them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12 warns inside its own avx512fintrin.h (an uninitialised "__Y" of the intrinsics themselves).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#ifdef HASFL_HAVE_AVX2_BUILD
namespace avx2 {
#define HASFL_CPU_TARGET __attribute__((target("avx2,fma")))
#define HASFL_TILE_TARGET HASFL_CPU_TARGET
#define HASFL_CPU_AVX2 1
#include "cpu/aggregate_tile.h"
#include "cpu/aggregate_cpu_kernel.h"
#undef HASFL_TILE_TARGET
#undef HASFL_CPU_AVX2
#undef HASFL_CPU_TARGET
}  // namespace avx2
#endif

namespace generic {
#define HASFL_CPU_TARGET
#define HASFL_TILE_TARGET
#define HASFL_CPU_AVX2 0
#include "cpu/aggregate_tile.h"
#include "cpu/aggregate_cpu_kernel.h"
#undef HASFL_TILE_TARGET
#undef HASFL_CPU_AVX2
#undef HASFL_CPU_TARGET
#define HASFL_SPARSE_TARGET
#define HASFL_SPARSE_AVX512 0
#define HASFL_SPARSE_AVX2 0
#include "cpu/aggregate_sparse_kernel.h"
#undef HASFL_SPARSE_AVX2
#undef HASFL_SPARSE_AVX512
#undef HASFL_SPARSE_TARGET
}  // namespace generic

#ifdef HASFL_HAVE_AVX2_BUILD
// The sparse kernel on a CPU with AVX2 but not AVX-512: the portable build's arithmetic, bit for bit, 16 columns a
// step over every covering entry (float32) or 4 columns at a time (float64; cpu/aggregate_sparse_kernel.h). Its
// target has no FMA, so that no multiply and add are fused.
namespace avx2sparse {
#define HASFL_SPARSE_TARGET __attribute__((target("avx2,popcnt")))
#define HASFL_TILE_TARGET HASFL_SPARSE_TARGET
#define HASFL_SPARSE_AVX512 0
#define HASFL_SPARSE_AVX2 1
#include "cpu/aggregate_tile.h"
#include "cpu/aggregate_sparse_kernel.h"
#undef HASFL_SPARSE_AVX2
#undef HASFL_TILE_TARGET
#undef HASFL_SPARSE_AVX512
#undef HASFL_SPARSE_TARGET
}  // namespace avx2sparse
#endif

#ifdef HASFL_HAVE_AVX2_BUILD
namespace avx512 {
#define HASFL_SPARSE_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,popcnt,fma")))
#define HASFL_TILE_TARGET HASFL_SPARSE_TARGET
#define HASFL_SPARSE_AVX512 1
#define HASFL_SPARSE_AVX2 0
#include "cpu/aggregate_tile.h"
#include "cpu/aggregate_sparse_kernel.h"
#include "cpu/aggregate_sparse_pull.h"
#undef HASFL_TILE_TARGET
#undef HASFL_SPARSE_AVX2
#undef HASFL_SPARSE_AVX512
#undef HASFL_SPARSE_TARGET
}  // namespace avx512
#endif

// The AVX2+FMA build where the CPU has both; HASFL_PORTABLE_CPU_KERNEL=1 forces the portable one (tests).
bool use_avx2() {
#ifdef HASFL_HAVE_AVX2_BUILD
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                std::getenv("HASFL_PORTABLE_CPU_KERNEL") == nullptr;
  return supported;
#else
  return false;
#endif
}

template <typename scalar_t>
void run_all_chunks(const CpuArgs& args, int64_t num_chunks, int64_t max_entries) {
  const bool avx2 = use_avx2();
#pragma omp parallel
  {
    std::vector<double> doubles(3 * kCpuTile + max_entries + 1);
    std::vector<int64_t> ints(3 * max_entries + 1);
    std::vector<const void*> starts(max_entries + 1);
    double* d = doubles.data();
    int64_t* i = ints.data();
    const void** x = starts.data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
      const bool nested = args.params[args.chunks[chunk * kChunkCols + kChunkParam] * kParamCols + kParamNested];
#ifdef HASFL_HAVE_AVX2_BUILD
      if (avx2) {
        const avx2::Scratch s{d, d + kCpuTile, d + 2 * kCpuTile, d + 3 * kCpuTile, i, i + max_entries, x, i + 2 * max_entries};
        if (nested)
          avx2::run_chunk<scalar_t, true>(args, chunk, s);
        else
          avx2::run_chunk<scalar_t, false>(args, chunk, s);
        continue;
      }
#endif
      const generic::Scratch s{d, d + kCpuTile, d + 2 * kCpuTile, d + 3 * kCpuTile, i, i + max_entries, x, i + 2 * max_entries};
      if (nested)
        generic::run_chunk<scalar_t, true>(args, chunk, s);
      else
        generic::run_chunk<scalar_t, false>(args, chunk, s);
    }
  }
}

// Fixed-order reductions: each entry over its parameter's chunks, then each client over its entries.
std::tuple<at::Tensor, at::Tensor, at::Tensor> reduce_results(const CpuArgs& args, const AggregatePlan& plan,
                                                              int64_t num_clients, const at::Tensor& chunk_covered) {
  at::Tensor div_num = at::zeros({num_clients}, at::kDouble);
  at::Tensor div_den = at::zeros({num_clients}, at::kDouble);
  const int64_t* cbegin = plan.client_entry_begin.data_ptr<int64_t>();
  const int64_t* centries = plan.client_entries.data_ptr<int64_t>();
  const int64_t* chunk_begin = plan.param_chunk_begin.data_ptr<int64_t>();
  double* num = div_num.data_ptr<double>();
  double* den = div_den.data_ptr<double>();
  for (int64_t i = 0; i < num_clients; ++i) {
    for (int64_t k = cbegin[i]; k < cbegin[i + 1]; ++k) {
      num[i] += reduce_entry(args.params, args.entries, args.chunks, chunk_begin, args.partial_num, centries[k]);
      den[i] += reduce_entry(args.params, args.entries, args.chunks, chunk_begin, args.partial_den, centries[k]);
    }
  }
  // A NaN sum as the canonical quiet NaN: which NaN an add of two NaNs returns follows its operand order, which each
  // build's compiler picks (the lanes' and partials' sums are adds).
  for (int64_t i = 0; i < num_clients; ++i) {
    if (num[i] != num[i]) num[i] = __builtin_nan("");
    if (den[i] != den[i]) den[i] = __builtin_nan("");
  }
  at::Tensor covered = chunk_covered.sum();
  return {div_num, div_den, covered};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_into_cpu(const at::Tensor& out, at::TensorList packed,
                                                                  const at::Tensor& params, const at::Tensor& entries,
                                                                  const at::Tensor& weights) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.device().is_cpu(), "out must be on the CPU for the CPU kernel, got ", out.device());
  const AggregatePlan plan = make_plan(params, entries, weights, kCpuTile, kCpuChunkElems);
  const int64_t num_entries = entries.size(0), num_clients = weights.size(0);
  const int64_t num_chunks = plan.chunks.size(0);
  std::vector<const void*> data(num_entries);
  for (int64_t e = 0; e < num_entries; ++e) data[e] = packed[e].data_ptr();
  at::Tensor partial_num = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor partial_den = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor chunk_covered = at::empty({num_chunks}, at::kLong);
  CpuArgs args{params.data_ptr<int64_t>(),
               entries.data_ptr<int64_t>(),
               plan.chunks.data_ptr<int64_t>(),
               data.data(),
               plan.entry_weight.data_ptr<double>(),
               plan.weight_prefix.data_ptr<double>(),
               out.data_ptr(),
               partial_num.data_ptr<double>(),
               partial_den.data_ptr<double>(),
               chunk_covered.data_ptr<int64_t>()};
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_into",
                             [&] { run_all_chunks<scalar_t>(args, num_chunks, plan.max_entries); });

  return reduce_results(args, plan, num_clients, chunk_covered);
}


// The AVX-512 build of the sparse kernel where the CPU has it (same switch as the AVX2 one).
bool use_avx512() {
#ifdef HASFL_HAVE_AVX2_BUILD
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                                std::getenv("HASFL_PORTABLE_CPU_KERNEL") == nullptr &&
                                std::getenv("HASFL_NO_AVX512_CPU_KERNEL") == nullptr;  // tests: the AVX2 build
  return supported;
#else
  return false;
#endif
}

template <typename scalar_t>
void run_all_mixed(const CpuArgs& args, const SparseArgs& sp, const int64_t* K, int64_t num_chunks,
                   int64_t max_entries) {
  const bool avx2 = use_avx2(), avx512 = use_avx512();
#pragma omp parallel
    {
      std::vector<double> doubles(3 * kCpuTile + max_entries + 1);
      std::vector<double> sparse_doubles(3 * (kCpuTile + 16), 0.0);
      std::vector<int64_t> ints(6 * max_entries + 1);
      std::vector<const void*> starts(max_entries + 1);
      double* d = doubles.data();
      int64_t* i = ints.data();
      const void** x = starts.data();
      double* sd = sparse_doubles.data();
      std::vector<PullEntry> pull(avx512 || avx2 ? max_entries + 1 : 1);  // aligned: C++17's operator new
      std::vector<Line> kept(avx512 ? 8 * (max_entries + 1) : 1);
      const SparseScratch ss{sd, sd + kCpuTile + 16, sd + 2 * (kCpuTile + 16), i, i + max_entries, pull.data(),
                             kept.data()->v, i + 3 * max_entries, i + 4 * max_entries, i + 5 * max_entries};
#pragma omp for schedule(dynamic, 1)
      for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
        const int64_t p = args.chunks[chunk * kChunkCols + kChunkParam];
        if (K[p]) {
#ifdef HASFL_HAVE_AVX2_BUILD
          if (avx512) {
            avx512::run_sparse_chunk<scalar_t>(args, sp, chunk, ss);
            continue;
          }
          if (avx2) {
            avx2sparse::run_sparse_chunk<scalar_t>(args, sp, chunk, ss);
            continue;
          }
#endif
          generic::run_sparse_chunk<scalar_t>(args, sp, chunk, ss);
          continue;
        }
        const bool nested = args.params[p * kParamCols + kParamNested];
#ifdef HASFL_HAVE_AVX2_BUILD
        if (avx2) {
          const avx2::Scratch s{d, d + kCpuTile, d + 2 * kCpuTile, d + 3 * kCpuTile, i, i + max_entries, x, i + 2 * max_entries};
          if (nested)
            avx2::run_chunk<scalar_t, true>(args, chunk, s);
          else
            avx2::run_chunk<scalar_t, false>(args, chunk, s);
          continue;
        }
#endif
        const generic::Scratch s{d, d + kCpuTile, d + 2 * kCpuTile, d + 3 * kCpuTile, i, i + max_entries, x, i + 2 * max_entries};
        if (nested)
          generic::run_chunk<scalar_t, true>(args, chunk, s);
        else
          generic::run_chunk<scalar_t, false>(args, chunk, s);
      }
    }
  (void)avx2;
  (void)avx512;
}

// Dense (slice/window) parameters through the dense kernel, sparse ones (index sets, masks) through the
// sparse kernel, in one parallel loop over the chunks of all parameters.
std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sparse_into_cpu(
    const at::Tensor& out, at::TensorList packed, const at::Tensor& params, const at::Tensor& entries,
    const at::Tensor& weights, const at::Tensor& kinds, at::TensorList bits, const at::Tensor& rows,
    const at::Tensor& row_offsets) {
  check_aggregate_args(packed, params, entries, weights, out);
  TORCH_CHECK(out.device().is_cpu(), "out must be on the CPU for the CPU kernel, got ", out.device());
  const int64_t num_entries = entries.size(0), num_clients = weights.size(0);
  std::vector<const uint8_t*> bits_ptr(num_entries, nullptr);
  std::vector<int64_t> bits_len(num_entries, 0);
  TORCH_CHECK(static_cast<int64_t>(bits.size()) == num_entries, "bits has ", bits.size(), " tensors but entries has ",
              num_entries, " rows");
  const int64_t* K = kinds.data_ptr<int64_t>();
  const int64_t* E = entries.data_ptr<int64_t>();
  for (int64_t e = 0; e < num_entries; ++e) {
    if (K[E[e * kEntryCols + kEntryParam]] == 0) continue;
    TORCH_CHECK(bits[e].scalar_type() == at::kByte && bits[e].device().is_cpu() && bits[e].is_contiguous() &&
                    bits[e].dim() == 1,
                "bits[", e, "] must be a contiguous 1-D uint8 CPU tensor");
    bits_ptr[e] = bits[e].data_ptr<uint8_t>();
    bits_len[e] = bits[e].numel();
  }
  const SparsePrep prep = prepare_sparse(params, entries, kinds, bits_ptr, bits_len, rows, row_offsets, kCpuTile);
  const AggregatePlan plan = make_plan(params, entries, weights, kCpuTile, kCpuChunkElems);
  const int64_t num_chunks = plan.chunks.size(0);
  std::vector<const void*> data(num_entries);
  for (int64_t e = 0; e < num_entries; ++e) data[e] = packed[e].data_ptr();
  at::Tensor partial_num = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor partial_den = at::zeros({plan.num_partials}, at::kDouble);
  at::Tensor chunk_covered = at::empty({num_chunks}, at::kLong);
  CpuArgs args{params.data_ptr<int64_t>(), entries.data_ptr<int64_t>(), plan.chunks.data_ptr<int64_t>(), data.data(),
               plan.entry_weight.data_ptr<double>(), plan.weight_prefix.data_ptr<double>(), out.data_ptr(),
               partial_num.data_ptr<double>(), partial_den.data_ptr<double>(), chunk_covered.data_ptr<int64_t>()};
  // Per sparse parameter: are all its entries' words runs (the AVX-512 and AVX2 kernels then load them masked)?
  std::vector<uint8_t> runs(params.size(0), 0);
  if (use_avx512() || use_avx2()) {
    const int64_t* P = params.data_ptr<int64_t>();
    for (int64_t p = 0; p < params.size(0); ++p) {
      if (K[p] == 0) continue;
      const int64_t* param = P + p * kParamCols;
      bool all = true;
      for (int64_t e = param[kParamEntryBegin]; all && e < param[kParamEntryEnd]; ++e)
        all = run_words(bits_ptr[e], layout::row_length(param));
      runs[p] = all;
    }
  }
  const SparseArgs sp{bits_ptr.data(), prep.row_map.data(), prep.row_map_begin.data(), prep.tile_prefix.data(),
                      prep.prefix_begin.data(), runs.data()};
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "hasfl_ray::aggregate_sparse_into",
                             [&] { run_all_mixed<scalar_t>(args, sp, K, num_chunks, plan.max_entries); });
  return reduce_results(args, plan, num_clients, chunk_covered);
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CPU, m) {
  m.impl("aggregate_into", &aggregate_into_cpu);
  m.impl("aggregate_sparse_into", &aggregate_sparse_into_cpu);
}

}  // namespace hasfl_ray
