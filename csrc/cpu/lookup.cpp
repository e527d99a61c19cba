// CPU kernels of the lookup ops: pooled gather, per-key gradient reduction and the fused optimizer
// row updates. Schemas: the "lookup" section of csrc/ops.cpp. CUDA twins: csrc/cuda/lookup.cu.
//
// Row layout of the value buffers (see dynamicemb_core/optim/layout.py):
//   [ embedding (D) | optimizer state ]   SGD: no state; ADAGRAD: m (D); ROWWISE_ADAGRAD: m (1);
//                                         ADAM: m (D), v (D).
// The update formulas are FBGEMM's (fbgemm_gpu/codegen/genscript/optimizers.py), written here per row.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

#include "dynamicemb/bag_checks.h"
#include "dynamicemb/hashing.h"
#include "dynamicemb/check.h"

namespace dynamicemb {
namespace {

// Rows sit at random slots of large buffers, so the row loops wait on memory: they prefetch the
// row kPrefetchAhead positions ahead (every cache line of it) while computing the current one.
constexpr int64_t kPrefetchAhead = 8;
constexpr int64_t kCacheLine = 64;

template <int kWrite>
inline void prefetch_bytes(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += kCacheLine) __builtin_prefetch(p + b, kWrite, 3);
}

inline void prefetch_row(const float* row, int64_t n) { prefetch_bytes<1>(row, n * 4); }

// Fills bag_of[i] with the bag of index i; validates offsets on the way.
std::vector<int64_t> bag_of_indices(const int64_t* off, int64_t num_bags, int64_t n,
                                    const char* op) {
  DEMB_CHECK_VALUE(off[0] == 0 && off[num_bags] == n, op,
                    ": offsets must start at 0 and end at n=", n, ", got [", off[0], ", ...,",
                    off[num_bags], "]");
  std::vector<int64_t> bag_of(n);
  for (int64_t b = 0; b < num_bags; ++b) {
    DEMB_CHECK_VALUE(off[b] <= off[b + 1], op, ": offsets must be non-decreasing; offsets[",
                      b, "]=", off[b], " > offsets[", b + 1, "]=", off[b + 1]);
    for (int64_t i = off[b]; i < off[b + 1]; ++i) bag_of[i] = b;
  }
  return bag_of;
}

at::Tensor pooled_gather_cpu(const at::Tensor& embeddings, const at::Tensor& inverse,
                             const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                             int64_t mode, bool /*check: the CPU kernels always check*/) {
  check_bags(inverse, offsets, weights, mode, "pooled_gather");
  DEMB_CHECK_VALUE(embeddings.dim() == 2, "pooled_gather: embeddings must be (u, D), got ",
                    embeddings.sizes());
  // Rows may be a column slice of a wider buffer (the embedding part of a table's value rows):
  // only the innermost stride must be 1, rows are addressed by their own stride.
  const auto emb = embeddings.stride(1) == 1 ? embeddings : embeddings.contiguous();
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const int64_t num_bags = off.numel() - 1;
  const int64_t D = emb.size(1);
  const int64_t u = emb.size(0);
  const int64_t row_stride = emb.stride(0);
  const int64_t* off_p = off.data_ptr<int64_t>();
  const int64_t* inv_p = inv.data_ptr<int64_t>();
  DEMB_CHECK_VALUE(off_p[0] == 0 && off_p[num_bags] == inv.numel(),
                    "pooled_gather: offsets must start at 0 and end at n=", inv.numel(),
                    ", got first ", off_p[0], " last ", off_p[num_bags]);
  const at::Tensor w_c = weights.has_value() ? weights->contiguous() : at::Tensor();
  const float* w_p = w_c.defined() ? w_c.data_ptr<float>() : nullptr;
  // Every element of out is written below: no zero fill (fresh large buffers cost page faults).
  auto out = at::empty({num_bags, D}, emb.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, emb.scalar_type(), "pooled_gather", [&] {
    // float for float/half/bfloat16 (as FBGEMM accumulates), double for double.
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* e = emb.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, num_bags, 64, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> acc(D);
      const int64_t chunk_end = off_p[end];
      for (int64_t b = begin; b < end; ++b) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        const int64_t lo = off_p[b], hi = off_p[b + 1];
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t ahead = i + kPrefetchAhead;
          if (ahead < chunk_end && inv_p[ahead] >= 0 && inv_p[ahead] < u) {
            prefetch_bytes<0>(e + inv_p[ahead] * row_stride, D * int64_t(sizeof(scalar_t)));
          }
          const int64_t r = inv_p[i];
          DEMB_CHECK_INDEX(r >= 0 && r < u, "pooled_gather: inverse[", i, "]=", r,
                            " out of range [0, ", u, ")");
          const acc_t w = w_p ? acc_t(w_p[i]) : acc_t(1);
          const scalar_t* row = e + r * row_stride;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * acc_t(row[d]);
        }
        const acc_t scale = (mode == kPoolMean && hi > lo) ? acc_t(1) / acc_t(hi - lo) : acc_t(1);
        for (int64_t d = 0; d < D; ++d) o[b * D + d] = scalar_t(acc[d] * scale);
      }
    });
  });
  return out;
}

// The reduction behind reduce_grads: validates the bags, then
// calls sink(k, acc) once per unique key k in [0, num_unique) with acc (D floats) the sum of
// scale * grad_bags[bag] over the key's positions, in input order. keep(k) false skips key k (no
// sum is formed). Each key is summed by one thread in a fixed order: the result is deterministic.
template <typename Keep, typename Sink>
void reduce_per_key(const at::Tensor& grad_bags, const at::Tensor& inverse,
                    const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                    int64_t mode, int64_t num_unique, const char* op, Keep keep, Sink sink) {
  check_bags(inverse, offsets, weights, mode, op);
  DEMB_CHECK_VALUE(grad_bags.dim() == 2 && grad_bags.size(0) == offsets.numel() - 1, op,
                    ": grad_bags must be (b, D) with b = offsets.numel()-1 = ",
                    offsets.numel() - 1, ", got ", grad_bags.sizes());
  DEMB_CHECK_VALUE(num_unique >= 0, op, ": num_unique must be >= 0, got ", num_unique);
  const auto g = grad_bags.contiguous().to(at::kFloat);
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const int64_t n = inv.numel();
  const int64_t num_bags = off.numel() - 1;
  const int64_t D = g.size(1);
  const int64_t* inv_p = inv.data_ptr<int64_t>();
  const int64_t* off_p = off.data_ptr<int64_t>();
  const at::Tensor w_c = weights.has_value() ? weights->contiguous() : at::Tensor();
  const float* w_p = w_c.defined() ? w_c.data_ptr<float>() : nullptr;
  const auto bag_of = bag_of_indices(off_p, num_bags, n, op);

  // CSR of index positions per unique key, in input order.
  std::vector<int64_t> start(num_unique + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    DEMB_CHECK_INDEX(inv_p[i] >= 0 && inv_p[i] < num_unique, op, ": inverse[", i, "]=",
                      inv_p[i], " out of range [0, ", num_unique, ")");
    ++start[inv_p[i] + 1];
  }
  for (int64_t k = 0; k < num_unique; ++k) start[k + 1] += start[k];
  std::vector<int64_t> pos(n), fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) pos[fill[inv_p[i]]++] = i;

  const float* g_p = g.data_ptr<float>();
  at::parallel_for(0, num_unique, 64, [&](int64_t begin, int64_t end) {
    // A private accumulator (no aliasing with the inputs) lets the compiler vectorize the sum.
    std::vector<float> acc(D);
    float* a = acc.data();
    for (int64_t k = begin; k < end; ++k) {
      if (!keep(k)) continue;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = start[k]; j < start[k + 1]; ++j) {
        const int64_t i = pos[j];
        const int64_t b = bag_of[i];
        float scale = w_p ? w_p[i] : 1.0f;
        if (mode == kPoolMean) scale /= float(off_p[b + 1] - off_p[b]);
        const float* __restrict__ src = g_p + b * D;
        for (int64_t d = 0; d < D; ++d) a[d] += scale * src[d];
      }
      sink(k, static_cast<const float*>(a), D);
    }
  });
}

at::Tensor reduce_grads_cpu(const at::Tensor& grad_bags, const at::Tensor& inverse,
                            const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                            int64_t mode, int64_t num_unique, bool /*check: the CPU kernels always check*/) {
  DEMB_CHECK_VALUE(grad_bags.dim() == 2, "reduce_grads: grad_bags must be (b, D), got ",
                    grad_bags.sizes());
  DEMB_CHECK_VALUE(num_unique >= 0, "reduce_grads: num_unique must be >= 0, got ", num_unique);
  auto out = at::empty({num_unique, grad_bags.size(1)}, grad_bags.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  reduce_per_key(
      grad_bags, inverse, offsets, weights, mode, num_unique, "reduce_grads",
      [](int64_t) { return true; },
      [&](int64_t k, const float* acc, int64_t D) { std::copy(acc, acc + D, o + k * D); });
  return out;
}

// Shared preconditions of the row updates; returns D.
int64_t check_update(const at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                     int64_t state_per_dim, int64_t state_fixed, const char* op) {
  DEMB_CHECK_TYPE(values.scalar_type() == at::kFloat, op, ": values must be float32, got ",
                   values.scalar_type());
  DEMB_CHECK_TYPE(grads.scalar_type() == at::kFloat, op, ": grads must be float32, got ",
                   grads.scalar_type());
  DEMB_CHECK_TYPE(slots.scalar_type() == at::kLong, op, ": slots must be int64, got ",
                   slots.scalar_type());
  DEMB_CHECK_VALUE(values.dim() == 2 && values.is_contiguous(), op,
                    ": values must be a contiguous (capacity, row_width) tensor, got ",
                    values.sizes());
  DEMB_CHECK_VALUE(grads.dim() == 2 && slots.dim() == 1 && grads.size(0) == slots.size(0), op,
                    ": grads must be (n, D) and slots (n,), got ", grads.sizes(), " and ",
                    slots.sizes());
  const int64_t D = grads.size(1);
  const int64_t need = D + state_per_dim * D + state_fixed;
  DEMB_CHECK_VALUE(values.size(1) >= need, op, ": row_width ", values.size(1),
                    " is too small for dim ", D, " and its optimizer state (needs ", need, ")");
  return D;
}

// Runs f(row pointer, grad pointer) for every slot >= 0, in parallel (slots are unique).
template <typename F>
void for_each_row(const at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                  const char* op, F f) {
  const auto s = slots.contiguous();
  const auto g = grads.contiguous();
  const int64_t* s_p = s.data_ptr<int64_t>();
  const float* g_p = g.data_ptr<float>();
  float* v_p = values.data_ptr<float>();
  const int64_t cap = values.size(0), W = values.size(1), D = g.size(1);
  for (int64_t i = 0; i < s.numel(); ++i) {
    DEMB_CHECK_INDEX(s_p[i] < cap, op, ": slot ", s_p[i], " out of range [0, ", cap, ")");
  }
  at::parallel_for(0, s.numel(), 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Rows sit at random slots of a large buffer: each update waits on memory, so fetch the
      // rows a few slots ahead while this one is computed.
      if (i + kPrefetchAhead < end && s_p[i + kPrefetchAhead] >= 0) {
        prefetch_row(v_p + s_p[i + kPrefetchAhead] * W, W);
      }
      if (s_p[i] < 0) continue;
      f(v_p + s_p[i] * W, g_p + i * D, D);
    }
  });
}

void sgd_update_cpu(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                    double lr, bool /*check: the CPU kernels always check*/) {
  check_update(values, slots, grads, 0, 0, "sgd_update");
  const float lr_f = float(lr);
  for_each_row(values, slots, grads, "sgd_update", [&](float* __restrict__ w, const float* __restrict__ g, int64_t D) {
    for (int64_t d = 0; d < D; ++d) w[d] -= lr_f * g[d];
  });
}

void adagrad_update_cpu(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                        double lr, double eps, bool /*check: the CPU kernels always check*/) {
  check_update(values, slots, grads, 1, 0, "adagrad_update");
  const float lr_f = float(lr), eps_f = float(eps);
  for_each_row(values, slots, grads, "adagrad_update", [&](float* __restrict__ w, const float* __restrict__ g, int64_t D) {
    // Disjoint parts of one row: restrict lets the compiler vectorize.
    float* __restrict__ m = w + D;
    for (int64_t d = 0; d < D; ++d) {
      m[d] += g[d] * g[d];
      w[d] -= lr_f * g[d] / (std::sqrt(m[d]) + eps_f);
    }
  });
}

void rowwise_adagrad_update_cpu(at::Tensor& values, const at::Tensor& slots,
                                const at::Tensor& grads, double lr, double eps,
                                double weight_decay, int64_t weight_decay_mode, bool /*check: the CPU kernels always check*/) {
  check_update(values, slots, grads, 0, 1, "rowwise_adagrad_update");
  DEMB_CHECK_VALUE(weight_decay_mode >= 0 && weight_decay_mode <= 2,
                    "rowwise_adagrad_update: weight_decay_mode must be 0 (NONE), 1 (L2) or 2 "
                    "(DECOUPLE), got ", weight_decay_mode);
  const float lr_f = float(lr), eps_f = float(eps), wd = float(weight_decay);
  for_each_row(values, slots, grads, "rowwise_adagrad_update",
               [&](float* __restrict__ w, const float* __restrict__ g, int64_t D) {
                 float sum_sq = 0.0f;
                 for (int64_t d = 0; d < D; ++d) {
                   const float gd = weight_decay_mode == 1 ? g[d] + wd * w[d] : g[d];
                   sum_sq += gd * gd;
                 }
                 float* m = w + D;
                 m[0] += D > 0 ? sum_sq / float(D) : 0.0f;
                 const float mult = lr_f / (std::sqrt(m[0]) + eps_f);
                 float correction = 1.0f;
                 if (weight_decay_mode == 1) correction = 1.0f - mult * wd;
                 if (weight_decay_mode == 2) correction = 1.0f - lr_f * wd;
                 for (int64_t d = 0; d < D; ++d) w[d] = correction * w[d] - mult * g[d];
               });
}

void adam_update_cpu(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                     double lr, double eps, double beta1, double beta2, double weight_decay,
                     int64_t step, bool /*check: the CPU kernels always check*/) {
  check_update(values, slots, grads, 2, 0, "adam_update");
  DEMB_CHECK_VALUE(step >= 1, "adam_update: step must be >= 1 (bias correction), got ", step);
  const float lr_f = float(lr), eps_f = float(eps), b1 = float(beta1), b2 = float(beta2);
  const float wd = float(weight_decay);
  const float bc1 = 1.0f - std::pow(b1, float(step));
  const float bc2 = 1.0f - std::pow(b2, float(step));
  for_each_row(values, slots, grads, "adam_update", [&](float* __restrict__ w, const float* __restrict__ g, int64_t D) {
    // Disjoint parts of one row: restrict lets the compiler vectorize.
    float* __restrict__ m = w + D;
    float* __restrict__ v = w + 2 * D;
    for (int64_t d = 0; d < D; ++d) {
      const float md = b1 * m[d] + (1.0f - b1) * g[d];
      const float vd = b2 * v[d] + (1.0f - b2) * g[d] * g[d];
      m[d] = md;
      v[d] = vd;
      w[d] -= lr_f * (md / bc1 / (std::sqrt(vd / bc2) + eps_f) + wd * w[d]);
    }
  });
}

// Deduplicates keys with an open-addressing hash set (linear probing over the table's own hash),
// in one serial pass: O(n), and unique keys come out in order of first occurrence, which makes
// the result (and the table's slot assignment that follows) deterministic.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_cpu(const at::Tensor& keys) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong, "unique: keys must be int64, got ",
                   keys.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1, "unique: keys must be 1-D, got ", keys.sizes());
  const auto k = keys.contiguous();
  const int64_t n = k.numel();
  const int64_t* kp = k.data_ptr<int64_t>();
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  std::vector<int64_t> slot_of(cap, -1);  // unique index held by each hash slot, -1 = empty
  auto inverse = at::empty({n}, k.options());
  int64_t* inv = inverse.data_ptr<int64_t>();
  std::vector<int64_t> uniq;
  std::vector<int64_t> counts;
  uniq.reserve(n);
  counts.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = hash_key(kp[i]) & mask;
    while (true) {
      const int64_t u = slot_of[h];
      if (u < 0) {
        slot_of[h] = static_cast<int64_t>(uniq.size());
        inv[i] = slot_of[h];
        uniq.push_back(kp[i]);
        counts.push_back(1);
        break;
      }
      if (uniq[u] == kp[i]) {
        inv[i] = u;
        ++counts[u];
        break;
      }
      h = (h + 1) & mask;
    }
  }
  const int64_t m = static_cast<int64_t>(uniq.size());
  auto out_keys = at::empty({m}, k.options());
  auto out_counts = at::empty({m}, k.options());
  std::copy(uniq.begin(), uniq.end(), out_keys.data_ptr<int64_t>());
  std::copy(counts.begin(), counts.end(), out_counts.data_ptr<int64_t>());
  return {out_keys, inverse, out_counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("unique", &unique_cpu);
  m.impl("pooled_gather", &pooled_gather_cpu);
  m.impl("reduce_grads", &reduce_grads_cpu);
  m.impl("sgd_update", &sgd_update_cpu);
  m.impl("adagrad_update", &adagrad_update_cpu);
  m.impl("rowwise_adagrad_update", &rowwise_adagrad_update_cpu);
  m.impl("adam_update", &adam_update_cpu);
}

}  // namespace dynamicemb
