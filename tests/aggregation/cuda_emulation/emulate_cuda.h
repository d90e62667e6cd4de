// Just enough of CUDA to run the aggregation kernels (csrc/cuda/dense_kernels.cuh, dense_reduce.cuh,
// sparse_kernels.cuh) on the CPU, for a machine without a GPU. A block's threads are fibers on the calling thread
// (each started once by swapcontext, then switched by _setjmp/_longjmp: no system call a switch). A fiber runs until
// it reaches a barrier: __syncthreads waits for the whole block, each __shfl_xor_sync (its lanes' values exchanged
// between two barriers) for the whole warp. Threads that reach barriers no CUDA run could pass (part of a warp at a
// shuffle and part elsewhere, part of a block returned while the rest waits) abort with a message, as they would
// hang or be undefined on a card. Blocks run one after the other; __shared__ variables are function statics (one
// block at a time), dynamic shared memory one buffer (emu_block.dynamic); atomics are plain (one thread runs at a
// time). fma is C's (correctly rounded, as CUDA's double fma).
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
#define HASFL_EMULATED_CUDA 1
#define HASFL_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(emu_block.dynamic.data())

struct float4 {
  float x, y, z, w;
};
struct double2 {
  double x, y;
};
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline unsigned long long atomicAdd(unsigned long long* at, unsigned long long value) {
  const unsigned long long old = *at;
  *at = old + value;
  return old;
}

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
  static constexpr size_t kStack = 128 * 1024;
  ucontext_t scheduler_context;
  jmp_buf scheduler;
  std::vector<ucontext_t> fibers;
  std::vector<EmuJump> resume;
  std::vector<char> stacks;
  std::vector<int> waiting;  // per fiber: 0 running, a barrier kind, or -1 returned
  std::vector<char> started;
  std::vector<double> dynamic;  // dynamic shared memory
  unsigned current = 0, threads = 0, block = 0;
  unsigned long long lanes[1024];  // a shuffle's values' bits, by thread
};
inline EmuBlock emu_block;

inline void emu_barrier(int kind) {
  EmuBlock& b = emu_block;
  b.waiting[b.current] = kind;
  if (!_setjmp(b.resume[b.current].at)) _longjmp(b.scheduler, 1);
}

inline void __syncthreads() { emu_barrier(1); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T value, int lanes) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffled value is at most 8 bytes");
  const unsigned j = threadIdx.x;
  std::memcpy(&emu_block.lanes[j], &value, sizeof value);
  emu_barrier(2);
  T other;
  std::memcpy(&other, &emu_block.lanes[(j & ~31u) | ((j % 32) ^ static_cast<unsigned>(lanes))], sizeof other);
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

// kernel() on `blocks` blocks of `threads` (a multiple of 32, <= 1024) threads.
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
        if (b.waiting[t] != 0) continue;  // returned, or waiting at a barrier
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
      // Every fiber now waits or has returned: release each warp whose 32 threads all wait at a shuffle, else the
      // block where every thread waits at __syncthreads.
      bool released = false;
      int done = 0, synced = 0;
      for (unsigned w = 0; w < threads / 32; ++w) {
        int at_shuffle = 0;
        for (unsigned t = 32 * w; t < 32 * w + 32; ++t) at_shuffle += b.waiting[t] == 2;
        if (at_shuffle == 32) {
          for (unsigned t = 32 * w; t < 32 * w + 32; ++t) b.waiting[t] = 0;
          released = true;
        } else if (at_shuffle > 0) {
          std::fprintf(stderr, "emulated CUDA: block %u, warp %u: %d of 32 threads at a shuffle, the others not\n",
                       block, w, at_shuffle);
          std::abort();
        }
      }
      if (released) continue;
      for (unsigned t = 0; t < threads; ++t) {
        done += b.waiting[t] < 0;
        synced += b.waiting[t] == 1;
      }
      if (done == static_cast<int>(threads)) break;
      if (synced != static_cast<int>(threads)) {
        std::fprintf(stderr, "emulated CUDA: block %u: %d threads at __syncthreads, %d returned, of %u\n", block,
                     synced, done, threads);
        std::abort();
      }
      for (unsigned t = 0; t < threads; ++t) b.waiting[t] = 0;
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
