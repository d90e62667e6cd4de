// Just enough of CUDA to run the sparse op's kernels (csrc/cuda/sparse_kernels.cuh) on the CPU, for a machine
// without a GPU. A block's threads are fibers on the calling thread (each started once by swapcontext, then switched
// by _setjmp/_longjmp: no system call a switch), switched at every barrier: each
// __syncthreads and each __shfl_xor_sync (its lanes' values exchanged between two barriers) waits until every thread
// of the block has reached it. So a shuffle here must be reached by the whole block, as the kernels' shuffles are
// (their skips are uniform over the block): a kernel whose threads reach different barriers, or whose threads leave
// while others wait, aborts with a message, as it would hang or be undefined on a card. Blocks run one after the
// other; __shared__ variables are function statics (one block at a time). fma is C's (correctly rounded, as CUDA's
// double fma).
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct EmuDim {
  unsigned x = 0, y = 0, z = 0;
};
inline EmuDim threadIdx, blockIdx, blockDim;

// The block's fibers: each runs the kernel until it reaches a barrier (kind: 1 __syncthreads, 2 a shuffle's
// exchange) or returns; the scheduler resumes them all once every one waits at the same kind.
struct EmuJump {
  jmp_buf at;
};

struct EmuBlock {
  static constexpr size_t kStack = 256 * 1024;
  ucontext_t scheduler_context;
  jmp_buf scheduler;
  std::vector<ucontext_t> fibers;
  std::vector<EmuJump> resume;
  std::vector<char> stacks;
  std::vector<int> waiting;  // per fiber: 0 running, a barrier kind, or -1 returned
  std::vector<char> started;
  unsigned current = 0, threads = 0, block = 0;
  double lanes[1024];  // a shuffle's values, by thread
};
inline EmuBlock emu_block;

inline void emu_barrier(int kind) {
  EmuBlock& b = emu_block;
  b.waiting[b.current] = kind;
  if (!_setjmp(b.resume[b.current].at)) _longjmp(b.scheduler, 1);
}

inline void __syncthreads() { emu_barrier(1); }

inline double __shfl_xor_sync(unsigned, double value, int lanes) {
  const unsigned j = threadIdx.x;
  emu_block.lanes[j] = value;
  emu_barrier(2);
  const double other = emu_block.lanes[(j & ~31u) | ((j % 32) ^ static_cast<unsigned>(lanes))];
  emu_barrier(2);
  return other;
}

inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline double __longlong_as_double(long long bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline float __int_as_float(int bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

template <typename Kernel>
struct EmuStart {
  static inline Kernel* kernel = nullptr;
  static void run() {
    (*kernel)();
    emu_block.waiting[emu_block.current] = -1;
    _longjmp(emu_block.scheduler, 1);  // never returns: the scheduler's frame is not the one swapcontext saved
  }
};

// kernel() on `blocks` blocks of `threads` (<= 1024) threads.
template <typename Kernel>
void emu_launch(unsigned blocks, unsigned threads, Kernel&& kernel) {
  using K = std::remove_reference_t<Kernel>;
  EmuStart<K>::kernel = &kernel;
  EmuBlock& b = emu_block;
  b.threads = threads;
  b.fibers.assign(threads, ucontext_t{});
  b.resume.resize(threads);
  b.stacks.assign(threads * EmuBlock::kStack, 0);
  for (unsigned block = 0; block < blocks; ++block) {
    b.block = block;
    b.waiting.assign(threads, 0);
    b.started.assign(threads, 0);
    for (unsigned t = 0; t < threads; ++t) {
      getcontext(&b.fibers[t]);
      b.fibers[t].uc_stack.ss_sp = b.stacks.data() + t * EmuBlock::kStack;
      b.fibers[t].uc_stack.ss_size = EmuBlock::kStack;
      b.fibers[t].uc_link = nullptr;
      makecontext(&b.fibers[t], &EmuStart<K>::run, 0);
    }
    for (;;) {
      for (unsigned t = 0; t < threads; ++t) {
        if (b.waiting[t] < 0) continue;
        b.waiting[t] = 0;
        b.current = t;
        threadIdx = EmuDim{t, 0, 0};
        blockIdx = EmuDim{block, 0, 0};
        blockDim = EmuDim{threads, 0, 0};
        if (!_setjmp(b.scheduler)) {
          if (!b.started[t]) {
            b.started[t] = 1;
            swapcontext(&b.scheduler_context, &b.fibers[t]);
          } else {
            _longjmp(b.resume[t].at, 1);
          }
        }
      }
      int done = 0, kind = 0;
      bool agree = true;
      for (unsigned t = 0; t < threads; ++t) {
        if (b.waiting[t] < 0) ++done;
        else if (kind == 0) kind = b.waiting[t];
        else agree = agree && b.waiting[t] == kind;
      }
      if (done == static_cast<int>(threads)) break;
      if (done > 0 || !agree) {
        std::fprintf(stderr, "emulated CUDA: block %u's threads diverged at a barrier (%d returned, kinds %s)\n",
                     block, done, agree ? "equal" : "differ");
        std::abort();
      }
    }
  }
}

// A kernel without barriers or shuffles (one thread per item): its threads one after the other.
template <typename Kernel>
void emu_launch_serial(unsigned blocks, unsigned threads, Kernel&& kernel) {
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) {
      threadIdx = EmuDim{t, 0, 0};
      blockIdx = EmuDim{b, 0, 0};
      blockDim = EmuDim{threads, 0, 0};
      kernel();
    }
}
