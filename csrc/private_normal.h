// The DP noise's standard normal draw normal(seed, offset, j), one definition for the CPU kernels
// (cpu/aggregate_private.cpp) and the CUDA kernels (cuda/aggregate_private_cuda.cu): the same bits on any device.
//
// One Philox4x32-10 block (key: seed; counter: offset in the low 64 bits, j in the high ones; ATen's engine, whose
// integer arithmetic is the same on the host and the device) gives two 53-bit uniforms u1 in (0, 1] and u2 in
// [0, 1); the draw is sqrt(-2 ln u1) cos(2 pi u2) (Box-Muller). The C library's log and cos and CUDA's are not
// correctly rounded and not the same functions, so ln and cos are written out here in IEEE double operations
// alone, each rounded once in a fixed order: +, -, *, / and sqrt (correctly rounded on both), frexp and floor
// (exact). On the device every operation is an explicit round-to-nearest intrinsic (__dadd_rn, __dmul_rn, ...), which
// nvcc never contracts into a fused multiply-add (the build's --use_fast_math would contract a * b + c); the host
// code is portable C++ without FMA (setup.py builds it for x86-64 without -mfma; the tests check the host's draws
// bit for bit against hasfl_ray/aggregation/philox.py, the same operations in numpy).
//
//   ln u1: u1 = m 2^e with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), s = f / (2 + f), z = s^2,
//          ln m = f - (f^2/2 - s (f^2/2 + R(z))), R the series of 2 atanh(s) / s - 2 to z^11 (fdlibm's form), and
//          ln u1 = e ln2_hi + (ln m + e ln2_lo) with ln2_hi's trailing zeros making e ln2_hi exact;
//   cos 2 pi u2: t = 4 u2 (exact), q = floor(t + 1/2), r = t - q (exact, |r| <= 1/2), a = r pi/2, and by the
//          quadrant q mod 4: cos a, -sin a, -cos a, sin a, from their Taylor series to a^21 / a^22 (|a| <= pi/4).
// Within about an ulp of the true values (checked against numpy's log and cos in the tests).
#pragma once

#include <ATen/core/PhiloxRNGEngine.h>

#include <cmath>
#include <cstdint>

#include "aggregate_layout.h"  // HASFL_HD

namespace hasfl_ray {
namespace normal {

HASFL_HD double add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
HASFL_HD double sub(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
HASFL_HD double mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
HASFL_HD double quotient(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
HASFL_HD double root(double a) {
#ifdef __CUDA_ARCH__
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
HASFL_HD double split(double x, int* e) {
#ifdef __CUDA_ARCH__
  return frexp(x, e);
#else
  return std::frexp(x, e);
#endif
}
HASFL_HD double floor_of(double x) {
#ifdef __CUDA_ARCH__
  return floor(x);
#else
  return std::floor(x);
#endif
}

// ln x for x in (0, 1] (a uniform of the draw; not a general log: no zero, infinity or subnormal handling).
HASFL_HD double log_unit(double x) {
  int e = 0;
  double m = split(x, &e);  // x = m 2^e, m in [1/2, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {  // sqrt(1/2)
    m = mul(m, 2.0);
    e -= 1;
  }
  const double f = sub(m, 1.0);
  const double s = quotient(f, add(2.0, f));
  const double z = mul(s, s);
  double r = 0x1.642c8590b2164p-4;  // 2/23
  r = add(0x1.8618618618618p-4, mul(z, r));  // 2/21
  r = add(0x1.af286bca1af28p-4, mul(z, r));  // 2/19
  r = add(0x1.e1e1e1e1e1e1ep-4, mul(z, r));  // 2/17
  r = add(0x1.1111111111111p-3, mul(z, r));  // 2/15
  r = add(0x1.3b13b13b13b14p-3, mul(z, r));  // 2/13
  r = add(0x1.745d1745d1746p-3, mul(z, r));  // 2/11
  r = add(0x1.c71c71c71c71cp-3, mul(z, r));  // 2/9
  r = add(0x1.2492492492492p-2, mul(z, r));  // 2/7
  r = add(0x1.999999999999ap-2, mul(z, r));  // 2/5
  r = add(0x1.5555555555555p-1, mul(z, r));  // 2/3
  r = mul(z, r);
  const double hfsq = mul(mul(0.5, f), f);
  const double k = static_cast<double>(e);
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  // k ln2_hi - ((hfsq - (s (hfsq + R) + k ln2_lo)) - f)
  return sub(mul(k, ln2_hi), sub(sub(hfsq, add(mul(s, add(hfsq, r)), mul(k, ln2_lo))), f));
}

// sin a and cos a for |a| <= pi/4 (Taylor to a^21 and a^22).
HASFL_HD double sin_small(double a) {
  const double z = mul(a, a);
  double p = -0x1.761b41316381ap-75;  // -1/23!
  p = add(0x1.71b8ef6dcf572p-66, mul(z, p));
  p = add(-0x1.2f49b46814157p-57, mul(z, p));
  p = add(0x1.952c77030ad4ap-49, mul(z, p));
  p = add(-0x1.ae7f3e733b81fp-41, mul(z, p));
  p = add(0x1.6124613a86d09p-33, mul(z, p));
  p = add(-0x1.ae64567f544e4p-26, mul(z, p));
  p = add(0x1.71de3a556c734p-19, mul(z, p));
  p = add(-0x1.a01a01a01a01ap-13, mul(z, p));
  p = add(0x1.1111111111111p-7, mul(z, p));
  p = add(-0x1.5555555555555p-3, mul(z, p));  // -1/3!
  return add(a, mul(mul(a, z), p));
}
HASFL_HD double cos_small(double a) {
  const double z = mul(a, a);
  double p = -0x1.0ce396db7f853p-70;  // -1/22!
  p = add(0x1.e542ba4020225p-62, mul(z, p));
  p = add(-0x1.6827863b97d97p-53, mul(z, p));
  p = add(0x1.ae7f3e733b81fp-45, mul(z, p));
  p = add(-0x1.93974a8c07c9dp-37, mul(z, p));
  p = add(0x1.1eed8eff8d898p-29, mul(z, p));
  p = add(-0x1.27e4fb7789f5cp-22, mul(z, p));
  p = add(0x1.a01a01a01a01ap-16, mul(z, p));
  p = add(-0x1.6c16c16c16c17p-10, mul(z, p));
  p = add(0x1.5555555555555p-5, mul(z, p));  // 1/4!
  const double hz = mul(0.5, z);
  const double w = sub(1.0, hz);
  // w + (((1 - w) - hz) + z^2 p): the rounding of 1 - hz recovered
  return add(w, add(sub(sub(1.0, w), hz), mul(mul(z, z), p)));
}

// cos(2 pi u) for u in [0, 1).
HASFL_HD double cos_turn(double u) {
  const double t = mul(u, 4.0);
  const double q = floor_of(add(t, 0.5));
  const double a = mul(sub(t, q), 0x1.921fb54442d18p+0);  // (t - q) pi/2
  switch (static_cast<int>(q) & 3) {
    case 0: return cos_small(a);
    case 1: return -sin_small(a);
    case 2: return -cos_small(a);
    default: return sin_small(a);
  }
}

// normal(seed, offset, index): see the top of this file.
HASFL_HD double philox_normal(uint64_t seed, uint64_t offset, uint64_t index) {
  at::Philox4_32 engine(seed, index, offset);  // Philox4x32, 10 rounds
  const uint32_t a = engine(), b = engine(), c = engine(), d = engine();
  const double scale = 0x1p-53;
  const uint64_t x = ((static_cast<uint64_t>(a) << 32) | b) >> 11;
  const uint64_t y = ((static_cast<uint64_t>(c) << 32) | d) >> 11;
  const double u1 = mul(add(static_cast<double>(x), 0.5), scale);
  const double u2 = mul(static_cast<double>(y), scale);
  return mul(root(mul(-2.0, log_unit(u1))), cos_turn(u2));
}

}  // namespace normal
}  // namespace hasfl_ray
