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
#include <tuple>
#include <vector>

#include "aggregate_host.h"
#include "aggregate_layout.h"

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

// The kernel's 4-double vectors are passed between inline functions only; GCC's note that their ABI
// differs with and without AVX does not concern them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#ifdef HASFL_HAVE_AVX2_BUILD
namespace avx2 {
#define HASFL_CPU_TARGET __attribute__((target("avx2,fma")))
#define HASFL_CPU_AVX2 1
#include "cpu/aggregate_cpu_kernel.h"
#undef HASFL_CPU_AVX2
#undef HASFL_CPU_TARGET
}  // namespace avx2
#endif

namespace generic {
#define HASFL_CPU_TARGET
#define HASFL_CPU_AVX2 0
#include "cpu/aggregate_cpu_kernel.h"
#undef HASFL_CPU_AVX2
#undef HASFL_CPU_TARGET
}  // namespace generic

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

  // Fixed-order reductions: each entry over its parameter's chunks, then each client over its entries.
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
  at::Tensor covered = chunk_covered.sum();
  return {div_num, div_den, covered};
}

}  // namespace

TORCH_LIBRARY_IMPL(hasfl_ray, CPU, m) { m.impl("aggregate_into", &aggregate_into_cpu); }

}  // namespace hasfl_ray
