/**
 * @file grouped.h
 * @brief The grouped value ops' shared rules: the per-table metadata layout, the optimizer codes and
 *        the per-element update formulas, used by the CPU (csrc/cpu/grouped.cpp) and CUDA
 *        (csrc/cuda/grouped.cu) kernels alike.
 *
 * A group's value rows live in one flat 1-D buffer. Table ``t`` owns ``capacity`` rows of
 * ``row_width`` elements starting at element ``value_offset``; a row is ``[embedding (dim) |
 * optimizer state]`` (dynamicemb_core/optim/layout.py). ``meta`` is a (T, 4) int64 tensor on the
 * values' device whose row ``t`` is ``[value_offset, row_width, capacity, dim]``. Every grouped op
 * addresses a row by ``(table id, slot)``, so one launch serves all tables of a group.
 *
 * Row element type ``E``: the buffer's dtype. float32 rows are as above. A half-precision buffer
 * (float16 / bfloat16) stores the embedding in ``E`` and the optimizer state in float32 right after
 * it: ``[embedding (dim E) | one pad E when dim is odd | state (float32, two E each)]``; offsets,
 * widths and capacities in meta count ``E`` elements, and every row starts at an even element, so
 * the state is 4-byte aligned. The ops read and write *logical* rows, always float32:
 * ``[embedding as float | state]`` of ``logical_width`` columns; an update computes in float32 and
 * rounds the new embedding to ``E``: to nearest even (FBGEMM's CPU TBE for fp16 weights), or, given
 * a rounding seed, stochastically (FBGEMM's ``stochastic_rounding``; see round_update below).
 *
 * The update formulas are FBGEMM's exact optimizers (fbgemm_gpu/codegen/genscript/optimizers.py),
 * restated per element here so that both backends compute them from one definition.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "dynamicemb/host_device.h"

namespace dynamicemb {
namespace grouped {

// Columns of meta.
constexpr int kMetaOffset = 0;
constexpr int kMetaWidth = 1;
constexpr int kMetaCapacity = 2;
constexpr int kMetaDim = 3;
constexpr int kMetaColumns = 4;

// Pooling code of the grouped reduction beside SUM (0) and MEAN (1) of bag_checks.h: NONE, where
// index i's gradient is row i of a (n, D) sequence output.
constexpr int64_t kPoolNone = 2;

// Optimizer codes of grouped_update (dynamicemb_core.ops.lookup_ops.OPTIMIZER_CODES).
constexpr int64_t kSgd = 0;
constexpr int64_t kAdagrad = 1;
constexpr int64_t kRowwiseAdagrad = 2;
constexpr int64_t kAdam = 3;

/// Embedding elements of a row of element type ``E`` (a 2-byte type pads an odd dim by one).
template <typename E>
DEMB_HOST_DEVICE int64_t emb_span(int64_t dim) {
  return sizeof(E) == 4 ? dim : (dim + 1) / 2 * 2;
}

/// The optimizer state (float32) of ``row``, an ``E`` row of embedding dim ``dim``.
template <typename E>
DEMB_HOST_DEVICE float* state_of(E* row, int64_t dim) {
  return reinterpret_cast<float*>(row + emb_span<E>(dim));
}
template <typename E>
DEMB_HOST_DEVICE const float* state_of(const E* row, int64_t dim) {
  return reinterpret_cast<const float*>(row + emb_span<E>(dim));
}

/// Columns of a logical (float32) row whose stored row has ``width`` ``E`` elements.
template <typename E>
DEMB_HOST_DEVICE int64_t logical_width(int64_t width, int64_t dim) {
  return dim + (width - emb_span<E>(dim)) * int64_t(sizeof(E)) / 4;
}

/// Whether a stored row of ``width`` ``E`` elements at element ``offset`` holds its state aligned.
template <typename E>
DEMB_HOST_DEVICE bool row_layout_ok(int64_t offset, int64_t width, int64_t dim) {
  if (sizeof(E) == 4) return true;
  return width >= emb_span<E>(dim) && width % 2 == 0 && offset % 2 == 0;
}

/// Rounds a float32 result to the row type (to nearest even; identity for float).
template <typename E>
DEMB_HOST_DEVICE E to_row(float x) {
  return static_cast<E>(x);
}

struct UpdateParams {
  float lr, eps, beta1, beta2, weight_decay, bc1, bc2;
  int64_t weight_decay_mode;  // 0 NONE, 1 L2, 2 DECOUPLE (row-wise Adagrad)
  int64_t step;               // the training step (keys the stochastic rounding)
  int64_t rounding_seed;      // < 0: half-precision rows round to nearest; else stochastically
};

/// Parameters with Adam's bias corrections computed once per call. ``rounding_seed`` >= 0 asks for
/// stochastic rounding of half-precision rows (float32 rows are never rounded).
inline UpdateParams make_params(double lr, double eps, double beta1, double beta2,
                                double weight_decay, int64_t weight_decay_mode, int64_t step,
                                int64_t rounding_seed = -1) {
  UpdateParams p{};
  p.step = step;
  p.rounding_seed = rounding_seed;
  p.lr = float(lr);
  p.eps = float(eps);
  p.beta1 = float(beta1);
  p.beta2 = float(beta2);
  p.weight_decay = float(weight_decay);
  p.weight_decay_mode = weight_decay_mode;
  p.bc1 = 1.0f - std::pow(float(beta1), float(step));
  p.bc2 = 1.0f - std::pow(float(beta2), float(step));
  return p;
}

/// Optimizer state elements per row for ``dim`` (must match optim/layout.py's state_width).
DEMB_HOST_DEVICE int64_t state_width(int64_t optimizer, int64_t dim) {
  if (optimizer == kAdagrad) return dim;
  if (optimizer == kRowwiseAdagrad) return 1;
  if (optimizer == kAdam) return 2 * dim;
  return 0;
}

// Each operation of the formulas below is rounded on its own, on both backends. Left to itself,
// nvcc leaves a product followed by a sum for ptxas to fuse into one FMA or not, and ptxas decides
// per kernel: the same update applied by two kernels (the fused backward's chunk pass and the plain
// update, or the device and host parts of a hybrid table) then differs in the last bit. Rounded
// operations give the same bits in every kernel, and the CPU kernels' (x86-64 without FMA) too.
DEMB_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DEMB_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DEMB_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DEMB_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// EXACT_SGD on one element.
DEMB_HOST_DEVICE void sgd_element(float& w, float g, const UpdateParams& p) {
  w = sub_rn(w, mul_rn(p.lr, g));
}

/// EXACT_ADAGRAD on one element with its accumulator ``m``.
DEMB_HOST_DEVICE void adagrad_element(float& w, float& m, float g, const UpdateParams& p) {
  m = add_rn(m, mul_rn(g, g));
  w = sub_rn(w, div_rn(mul_rn(p.lr, g), add_rn(sqrtf(m), p.eps)));
}

/// ADAM on one element with its moments ``m``, ``v`` (decoupled weight decay as FBGEMM's).
DEMB_HOST_DEVICE void adam_element(float& w, float& m, float& v, float g, const UpdateParams& p) {
  m = add_rn(mul_rn(p.beta1, m), mul_rn(sub_rn(1.0f, p.beta1), g));
  v = add_rn(mul_rn(p.beta2, v), mul_rn(mul_rn(sub_rn(1.0f, p.beta2), g), g));
  const float step = div_rn(div_rn(m, p.bc1), add_rn(sqrtf(div_rn(v, p.bc2)), p.eps));
  w = sub_rn(w, mul_rn(p.lr, add_rn(step, mul_rn(p.weight_decay, w))));
}

/// Row-wise Adagrad, first pass: one element's contribution to the row's sum of squares.
DEMB_HOST_DEVICE float rowwise_square(float w, float g, const UpdateParams& p) {
  const float gd = p.weight_decay_mode == 1 ? add_rn(g, mul_rn(p.weight_decay, w)) : g;
  return mul_rn(gd, gd);
}

/// Row-wise Adagrad, the row's new accumulator from the old one and the row's sum of squares.
DEMB_HOST_DEVICE float rowwise_accumulator(float m, float sum_sq, int64_t dim) {
  return add_rn(m, dim > 0 ? div_rn(sum_sq, float(dim)) : 0.0f);
}

/// Row-wise Adagrad, second pass: one element from the new accumulator.
DEMB_HOST_DEVICE void rowwise_element(float& w, float g, float new_m, const UpdateParams& p) {
  const float mult = div_rn(p.lr, add_rn(sqrtf(new_m), p.eps));
  float correction = 1.0f;
  if (p.weight_decay_mode == 1) correction = sub_rn(1.0f, mul_rn(mult, p.weight_decay));
  if (p.weight_decay_mode == 2) correction = sub_rn(1.0f, mul_rn(p.lr, p.weight_decay));
  w = sub_rn(mul_rn(correction, w), mul_rn(mult, g));
}

// ---- rounding an updated embedding to the row type ----
//
// Stochastic rounding picks, for a float32 result x between two neighbouring values lo < x < hi of
// the row type, hi with probability (x - lo) / (hi - lo) and lo otherwise, so the rounded value is
// x on average: updates smaller than half a unit of the row type still move the weight in
// expectation (rounding to nearest drops them every time). The random numbers come from a
// counter-based hash of (seed, step, table, key, element): no state, the same bits on the CPU and
// the GPU, in any thread order, and the same run again for the same seed. The row's key, never its
// slot: where a key lives depends on the engine (the CUDA key-parallel engine places keys in an
// order that varies from run to run), the capacity and the insertion history, and a model's values
// must not depend on any of them.

/// splitmix64's finalizer: a bijective mix of 64 bits.
DEMB_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// How the updated embeddings of one row are rounded: ``stream`` is the row's random stream for
/// this update (seed, step, table, key hashed together), used only when ``stochastic``.
struct RowRounding {
  uint64_t stream = 0;
  bool stochastic = false;
};

/// The rounding of the row of ``key`` in ``table``. ``keys`` is the op's (n,) keys argument, null
/// when none was given (the ops require it when ``p.rounding_seed`` >= 0, so it is read only then).
DEMB_HOST_DEVICE RowRounding row_rounding(const UpdateParams& p, int64_t table,
                                          const int64_t* keys, int64_t i) {
  RowRounding r;
  if (p.rounding_seed < 0) return r;
  uint64_t h = mix64(uint64_t(p.rounding_seed) + 0x9E3779B97F4A7C15ULL);
  h = mix64(h ^ uint64_t(p.step));
  h = mix64(h ^ uint64_t(table));
  r.stream = mix64(h ^ uint64_t(keys[i]));
  r.stochastic = true;
  return r;
}

/// ``x`` rounded stochastically to the 2-byte type ``E`` (at::Half or at::BFloat16, bits in
/// ``.x``) with 24 uniform bits ``u``. Exact values, NaN and overflow round as to_row does.
template <typename E>
DEMB_HOST_DEVICE E round_stochastic(float x, uint32_t u) {
  const E near = to_row<E>(x);
  const float n = static_cast<float>(near);
  // n - n is 0 only for a finite n (inf and NaN give NaN)
  if (n == x || !(sub_rn(n, n) == 0.0f)) return near;
  // The other neighbour of x: one step of the sign-magnitude pattern away from or toward zero
  // (x and n have one sign). Past the largest finite value it is inf, and p below is 0.
  E other = near;
  other.x = static_cast<uint16_t>(fabsf(x) > fabsf(n) ? near.x + 1 : near.x - 1);
  const float o = static_cast<float>(other);
  // Both differences are exact (nearby floats); p <= 1/2 as n is the nearest.
  const float p = div_rn(fabsf(sub_rn(x, n)), fabsf(sub_rn(o, n)));
  return mul_rn(float(u), 5.9604644775390625e-8f) < p ? other : near;  // u / 2^24 < p
}

/// Element ``d`` of an updated row, rounded to the row type as ``r`` says (float rows: as is).
template <typename E>
DEMB_HOST_DEVICE E round_update(float x, const RowRounding& r, int64_t d) {
  if constexpr (sizeof(E) == 4) {
    return x;
  } else {
    if (!r.stochastic) return to_row<E>(x);
    const uint64_t bits = mix64(r.stream + uint64_t(d) * 0x9E3779B97F4A7C15ULL);
    return round_stochastic<E>(x, static_cast<uint32_t>(bits >> 40));
  }
}

}  // namespace grouped
}  // namespace dynamicemb
