/**
 * @file row_init.h
 * @brief Initial values of new rows (grouped_init_rows), one definition for the CPU and CUDA kernels.
 *
 * A row's embedding element ``d`` is a function of (seed, table, key, d) and the table's
 * initializer only: a counter-based random stream (mix64 of the four, no generator state), so a
 * key gets the same initial row on the CPU and the GPU, in any thread order, at any slot, and
 * whether it is initialised alone or with a million others. The seed is drawn by the caller from
 * torch's generator once per placing call, so ``torch.manual_seed`` still decides the values.
 *
 * The initializer of table ``t`` is row ``t`` of a (T, kInitColumns) float64 tensor:
 * ``[mode, p0, p1, p2, p3, p4, p5, state]`` (dynamicemb_core/lookup/initializers.py writes it):
 *   CONSTANT          p0 = value
 *   DEBUG             p0 = modulus (the element is float(key mod modulus), non-negative)
 *   UNIFORM           p0 = lower, p1 = upper: uniform in [lower, upper)
 *   NORMAL            p0 = mean, p1 = std
 *   TRUNCATED_NORMAL  p0 = mean, p1 = std, p2 = lower, p3 = upper, p4 = Phi(lower), p5 = Phi(upper)
 *                     (Phi of the standardised bounds): inverse-CDF sampling, u uniform in
 *                     [p4, p5], then mean + std * Phi^-1(u), clamped to [lower, upper]
 * ``state`` fills the optimizer-state columns of the row (the optimizer's initial value).
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "dynamicemb/grouped.h"
#include "dynamicemb/host_device.h"

namespace dynamicemb {
namespace grouped {

constexpr int kInitColumns = 8;
constexpr int kInitState = 7;
constexpr int64_t kInitConstant = 0;
constexpr int64_t kInitDebug = 1;
constexpr int64_t kInitUniform = 2;
constexpr int64_t kInitNormal = 3;
constexpr int64_t kInitTruncatedNormal = 4;

/// The random stream of (seed, table, key): each element ``d`` of the row hashes it with ``d``.
DEMB_HOST_DEVICE uint64_t init_stream(int64_t seed, int64_t table, int64_t key) {
  uint64_t h = mix64(uint64_t(seed) ^ 0xD1B54A32D192ED03ULL);
  h = mix64(h ^ uint64_t(table));
  return mix64(h ^ uint64_t(key));
}

/// 64 random bits of element ``d`` of a row's stream.
DEMB_HOST_DEVICE uint64_t init_bits(uint64_t stream, int64_t d) {
  return mix64(stream + uint64_t(d + 1) * 0x9E3779B97F4A7C15ULL);
}

/// The standard normal quantile Phi^-1(p) for p in (0, 1): a start from the logistic
/// approximation (centre) or the tail asymptote, then Halley steps on Phi(x) = p (cubic
/// convergence; Phi from erfc, accurate in the tails).
DEMB_HOST_DEVICE double normal_quantile(double p) {
  const double q = p < 0.5 ? p : 1.0 - p;  // the lower tail's probability
  double x;
  if (q < 0.02) {
    const double l = -2.0 * log(q);
    x = -sqrt(l - log(l) - 1.8378770664093453);  // ln(2 pi)
  } else {
    x = log(q / (1.0 - q)) / 1.702;
  }
  for (int i = 0; i < 4; ++i) {
    const double e = 0.5 * erfc(-x * 0.70710678118654752) - q;
    const double t = e * 2.5066282746310002 * exp(0.5 * x * x);  // sqrt(2 pi)
    x -= t / (1.0 + 0.5 * x * t);
  }
  return p < 0.5 ? x : -x;
}

/// Element ``d`` of the embedding of ``key`` under initializer row ``p`` (kInitColumns doubles).
DEMB_HOST_DEVICE float init_value(const double* p, uint64_t stream, int64_t key, int64_t d) {
  const int64_t mode = int64_t(p[0]);
  if (mode == kInitConstant) return float(p[1]);
  if (mode == kInitDebug) {
    const int64_t m = int64_t(p[1]);
    int64_t r = key % m;
    if (r < 0) r += m;
    return float(r);
  }
  const uint64_t bits = init_bits(stream, d);
  if (mode == kInitUniform) {
    const double u = double(bits >> 11) * 1.1102230246251565e-16;  // [0, 1), 53 bits
    const float hi = float(p[2]);
    const float v = float(p[1] + (p[2] - p[1]) * u);
    return v < hi ? v : nextafterf(hi, -INFINITY);  // [lower, upper) after rounding too
  }
  if (mode == kInitNormal) {
    // Box-Muller from two 32-bit uniforms: u1 in (0, 1], u2 in [0, 1)
    const double u1 = double((bits >> 32) + 1) * 2.3283064365386963e-10;
    const double u2 = double(bits & 0xFFFFFFFFULL) * 2.3283064365386963e-10;
    const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    return float(p[1] + p[2] * z);
  }
  // TRUNCATED_NORMAL
  double u = p[5] + (p[6] - p[5]) * (double(bits >> 11) * 1.1102230246251565e-16);
  u = u < 1e-12 ? 1e-12 : (u > 1.0 - 1e-12 ? 1.0 - 1e-12 : u);
  double x = p[1] + p[2] * normal_quantile(u);
  x = x < p[3] ? p[3] : (x > p[4] ? p[4] : x);
  return float(x);
}

}  // namespace grouped
}  // namespace dynamicemb
