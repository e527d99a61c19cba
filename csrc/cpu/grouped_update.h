// grouped_reduce_grads, grouped_update and grouped_reduce_update on CPU: the per-key gradient
// reduction and the fused optimizer updates.
// Part of csrc/cpu/grouped.cpp's one translation unit (as csrc/cuda/table.cu's headers): included
// there only, after grouped_common.h.
#pragma once

#include "grouped_common.h"

namespace dynamicemb {
namespace {

using namespace grouped;

/// The summing half of reduce_per_key: positions [start[k], start[k+1]) of key k read gradient
/// rows at ``src`` with ``scale`` (nullptr: every scale is 1).
struct KeySums {
  const MetaView* mv;
  const int64_t *start, *src;
  const float *scale, *grads;
  const int64_t* key_table;
  int64_t max_dim;
};

/// Key k's gradient sum into ``out``: ``FD`` > 0 its dim known at compile time (the sum stays in
/// registers), 0 read from meta. A scale of 1 is skipped (its product changes no bit).
template <int64_t FD, bool kScaled>
DEMB_ALWAYS_INLINE void sum_key(const KeySums& ks, int64_t k, int64_t dim, int64_t limit,
                                float* out) {
  const int64_t D = FD > 0 ? FD : dim;
  float local[FD > 0 ? FD : 1];
  float* __restrict__ a = FD > 0 ? local : out;
  for (int64_t d = 0; d < D; ++d) a[d] = 0.0f;
  const int64_t hi = ks.start[k + 1];
  for (int64_t j = ks.start[k]; j < hi; ++j) {
    // the positions ahead may be the next keys' (most keys have few): prefetch up to ``limit``
    if (j + kPrefetchAhead < limit) prefetch_row(ks.grads + ks.src[j + kPrefetchAhead], D);
    const float* __restrict__ row = ks.grads + ks.src[j];
    if constexpr (kScaled) {
      const float sc = ks.scale[j];
      for (int64_t d = 0; d < D; ++d) a[d] += sc * row[d];
    } else {
      for (int64_t d = 0; d < D; ++d) a[d] += row[d];
    }
  }
  if constexpr (FD > 0) {
    for (int64_t d = 0; d < D; ++d) out[d] = a[d];
  }
}

/// Keys [begin, end) in blocks: a block's sums go to a small buffer (it stays in cache), then its
/// sinks run in one loop that prefetches (ahead) the rows a few keys in advance, as
/// grouped_update does; interleaving each key's sum with its update left the update's random row
/// reads unhidden.
template <bool kScaled, typename Keep, typename Ahead, typename Sink>
DEMB_ALWAYS_INLINE void key_sums(const KeySums& ks, int64_t begin, int64_t end, Keep& keep,
                                 Ahead& ahead, Sink& sink) {
  const int64_t M = ks.max_dim;
  // Uninitialised: a key's sum is written before its sink reads it (skipped keys are not read).
  const std::unique_ptr<float[]> buf(new float[kKeyBlock * M]);
  for (int64_t kb = begin; kb < end; kb += kKeyBlock) {
    const int64_t ke = std::min(end, kb + kKeyBlock);
    for (int64_t k = kb; k < ke; ++k) {
      if (ks.start[k] == ks.start[k + 1] || !keep(k)) continue;
      const int64_t D = ks.mv->dim(ks.key_table[k]);
      float* a = buf.get() + (k - kb) * M;
      const int64_t limit = ks.start[ke];
      switch (D) {
        case 16: sum_key<16, kScaled>(ks, k, D, limit, a); break;
        case 32: sum_key<32, kScaled>(ks, k, D, limit, a); break;
        case 64: sum_key<64, kScaled>(ks, k, D, limit, a); break;
        case 128: sum_key<128, kScaled>(ks, k, D, limit, a); break;
        default: sum_key<0, kScaled>(ks, k, D, limit, a); break;
      }
    }
    for (int64_t k = kb; k < kb + kRowsAhead && k < ke; ++k) ahead(k);
    for (int64_t k = kb; k < ke; ++k) {
      if (k + kRowsAhead < ke) ahead(k + kRowsAhead);
      if (ks.start[k] == ks.start[k + 1] || !keep(k)) continue;
      sink(k, static_cast<const float*>(buf.get() + (k - kb) * M), ks.mv->dim(ks.key_table[k]));
    }
  }
}

template <typename Keep, typename Ahead, typename Sink>
void key_sums_plain(const KeySums& ks, int64_t begin, int64_t end, Keep& keep, Ahead& ahead,
                    Sink& sink) {
  if (ks.scale) return key_sums<true>(ks, begin, end, keep, ahead, sink);
  key_sums<false>(ks, begin, end, keep, ahead, sink);
}

#ifdef DEMB_CPU_AVX2
template <typename Keep, typename Ahead, typename Sink>
DEMB_TARGET_AVX2 void key_sums_avx2(const KeySums& ks, int64_t begin, int64_t end, Keep& keep,
                                    Ahead& ahead, Sink& sink) {
  if (ks.scale) return key_sums<true>(ks, begin, end, keep, ahead, sink);
  key_sums<false>(ks, begin, end, keep, ahead, sink);
}
#endif

// The reduction shared by grouped_reduce_grads and grouped_reduce_update: calls sink(k, acc, D)
// once per unique key k with acc the sum of scale * (the gradient row of each of its positions),
// positions in input order (deterministic). keep(k) false skips key k; ahead(k) is called a few
// keys before key k is summed (the update prefetches k's value row there). ``key_tables`` (optional,
// (u,)): each key's table, checked against the table of every feature reading it. All checks run in
// one serial pass before the first sink call, which also lays out, in key order, each position's
// gradient row offset and scale, so the parallel sums read two sequential arrays and the rows.
template <typename Keep, typename Ahead, typename Sink>
void reduce_per_key(const MetaView& mv, const at::Tensor& grad_out, const at::Tensor& inverse,
                    const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                    const at::Tensor& feature_tables, const at::Tensor& d_offsets, int64_t mode,
                    int64_t batch_size, int64_t num_unique, const int64_t* key_tables,
                    const int64_t* key_counts, const char* op, Keep keep, Ahead ahead,
                    Sink sink) {
  DEMB_CHECK_VALUE(num_unique >= 0, op, ": num_unique must be >= 0, got ", num_unique);
  const Bags b = bag_layout(mv, inverse, offsets, weights, feature_tables, d_offsets, mode,
                            batch_size, num_unique, op);
  DEMB_CHECK_TYPE(grad_out.scalar_type() == at::kFloat, op, ": grad_out must be float32, got ",
                  grad_out.scalar_type());
  DEMB_CHECK_VALUE(grad_out.dim() == 2, op, ": grad_out must be 2-D, got ", grad_out.sizes());
  if (mode == kPoolNone) {
    DEMB_CHECK_VALUE(grad_out.size(0) == b.n, op, ": grad_out must have one row per index (",
                     b.n, "), got ", grad_out.sizes());
  } else {
    DEMB_CHECK_VALUE(grad_out.size(0) == b.B && grad_out.size(1) == b.dofs_p[b.F], op,
                     ": grad_out must be (B, d_offsets[-1]) = (", b.B, ", ", b.dofs_p[b.F],
                     "), got ", grad_out.sizes());
  }
  // Rows are read at their own stride: a gradient whose columns are contiguous is read in place,
  // an expanded one (stride 0 over rows, as the gradient of ``out.sum()``) from its one row; only
  // other layouts are copied first.
  const int64_t G = grad_out.size(1);
  at::Tensor g;
  int64_t row_stride = G;
  if (grad_out.stride(1) == 1 || G <= 1) {
    g = grad_out;
    row_stride = grad_out.stride(0);
  } else if (grad_out.stride(0) == 0 && grad_out.size(0) > 0) {
    g = grad_out.select(0, 0).contiguous();
    row_stride = 0;
  } else {
    g = grad_out.contiguous();
  }
  const float* g_p = g.data_ptr<float>();
  for (int64_t f = 0; mode == kPoolNone && f < b.F; ++f) {
    DEMB_CHECK_VALUE(mv.dim(b.ft_p[f]) <= G, op, ": grad_out has ", G, " columns, table ",
                     b.ft_p[f], " has dim ", mv.dim(b.ft_p[f]));
  }
  // Pass 1, bag by bag (each bag's feature and table are known without a per-index array): check
  // each index's unique id and its table (the caller's key_tables, else the first table that
  // read the key), and count each key's positions. A one-table group with the dedup's
  // ``key_counts`` skips it: there is nothing to count, no table to compare (key_tables are in
  // range: all 0), and pass 2 checks the unique ids and that the counts fit the inverse.
  const bool counted = key_counts != nullptr && key_tables != nullptr && mv.T == 1;
  std::vector<int64_t> first_table(key_tables ? 0 : num_unique, -1), start(num_unique + 1, 0);
  int64_t* cnt = start.data() + 1;
  if (counted) {
    int64_t total = 0;
    for (int64_t k = 0; k < num_unique; ++k) {
      DEMB_CHECK_VALUE(key_counts[k] >= 0, op, ": key_counts[", k, "]=", key_counts[k],
                       " is negative");
      cnt[k] = key_counts[k];
      total += key_counts[k];
    }
    DEMB_CHECK_VALUE(total == b.n, op, ": key_counts sum to ", total, ", not to the ", b.n,
                     " indices");
  }
  for (int64_t bag = 0; !counted && bag < b.num_bags; ++bag) {
    const int64_t t = b.ft_p[bag / b.B];
    for (int64_t i = b.off_p[bag], hi = b.off_p[bag + 1]; i < hi; ++i) {
      check_inverse(b.inv_p, i, num_unique, op);
      const int64_t k = b.inv_p[i];
      int64_t want;
      if (key_tables) {
        want = key_tables[k];
      } else {
        if (first_table[k] < 0) first_table[k] = t;
        want = first_table[k];
      }
      DEMB_CHECK_VALUE(t == want, op, ": index ", i, " reads unique key ", k, " of table ", want,
                       " from a feature of table ", t);
      ++cnt[k];
    }
  }
  const int64_t* key_table = key_tables ? key_tables : first_table.data();
  for (int64_t k = 0; k < num_unique; ++k) start[k + 1] += start[k];
  // Pass 2: each position's gradient row offset and scale, laid out in key order (a counting
  // sort, stable: a key's positions stay in input order, so the sums are deterministic). Unit
  // scales (SUM without weights) are not stored: the sums add the rows as they are.
  const bool scaled = b.w_p != nullptr || mode == kPoolMean;
  // src and scale are filled below, every position once: no zero fill first (n elements each).
  const std::unique_ptr<int64_t[]> src(new int64_t[b.n]);
  const std::unique_ptr<float[]> scale(new float[scaled ? b.n : 0]);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t bag = 0; bag < b.num_bags; ++bag) {
    const int64_t lo = b.off_p[bag], hi = b.off_p[bag + 1];
    const float mean = mode == kPoolMean && hi > lo ? float(hi - lo) : 1.0f;
    const int64_t row = (bag % b.B) * row_stride + b.dofs_p[bag / b.B];
    for (int64_t i = lo; i < hi; ++i) {
      if (counted) check_inverse(b.inv_p, i, num_unique, op);
      const int64_t j = fill[b.inv_p[i]]++;
      // counts that do not fit the inverse: a key past its own range (caught below), here only
      // kept inside the n positions
      if (counted && j >= b.n) break;
      if (scaled) {
        float sc = b.w_p ? b.w_p[i] : 1.0f;
        if (mode == kPoolMean) sc /= mean;
        scale[j] = sc;
      }
      src[j] = mode == kPoolNone ? i * row_stride : row;
    }
  }
  for (int64_t k = 0; counted && k < num_unique; ++k) {
    DEMB_CHECK_VALUE(fill[k] == start[k + 1], op, ": key ", k, " has ", fill[k] - start[k],
                     " positions in inverse, key_counts says ", key_counts[k]);
  }
  int64_t max_dim = 0;
  for (int64_t t = 0; t < mv.T; ++t) max_dim = std::max(max_dim, mv.dim(t));
  const KeySums ks{&mv, start.data(), src.get(), scaled ? scale.get() : nullptr, g_p,
                   key_table, max_dim};
  at::parallel_for(0, num_unique, kKeyBlock, [&](int64_t begin, int64_t end) {
#ifdef DEMB_CPU_AVX2
    if (cpu_has_avx2()) return key_sums_avx2(ks, begin, end, keep, ahead, sink);
#endif
    key_sums_plain(ks, begin, end, keep, ahead, sink);
  });
}

at::Tensor grouped_reduce_grads_cpu(const at::Tensor& grad_out, const at::Tensor& meta,
                                    const at::Tensor& inverse, const at::Tensor& offsets,
                                    const std::optional<at::Tensor>& weights,
                                    const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                                    int64_t mode, int64_t batch_size, int64_t num_unique,
                                    int64_t width, bool /*check: the CPU kernels always check*/) {
  const char* op = "grouped_reduce_grads";
  DEMB_CHECK_VALUE(width >= 0, op, ": width must be >= 0, got ", width);
  check_meta(meta, grad_out.device(), op);
  // No values here: the metadata's dims are all the reduction reads (offsets unchecked).
  const MetaView mv(meta, -1, op);
  for (int64_t t = 0; t < mv.T; ++t) {
    DEMB_CHECK_VALUE(mv.dim(t) <= width, op, ": width ", width, " is below table ", t, "'s dim ",
                     mv.dim(t));
  }
  auto out = at::zeros({num_unique, width}, grad_out.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  reduce_per_key(mv, grad_out, inverse, offsets, weights, feature_tables, d_offsets, mode,
                 batch_size, num_unique, nullptr, nullptr, op, [](int64_t) { return true; },
                 [](int64_t) {},
                 [&](int64_t k, const float* acc, int64_t D) { std::copy(acc, acc + D, o + k * width); });
  return out;
}

/// Applies optimizer ``opt`` to one row ``w`` (its float32 state after the embedding) with ``g``:
/// each element computed in float32 and rounded back to ``E`` as ``r`` says.
template <typename E>
DEMB_ALWAYS_INLINE void update_row(int64_t opt, E* __restrict__ w, const float* __restrict__ g,
                                   int64_t D, const UpdateParams& p, const RowRounding& r) {
  float* __restrict__ m = state_of(w, D);
  if (opt == kSgd) {
    for (int64_t d = 0; d < D; ++d) {
      float x = static_cast<float>(w[d]);
      sgd_element(x, g[d], p);
      w[d] = round_update<E>(x, r, d);
    }
  } else if (opt == kAdagrad) {
    for (int64_t d = 0; d < D; ++d) {
      float x = static_cast<float>(w[d]);
      adagrad_element(x, m[d], g[d], p);
      w[d] = round_update<E>(x, r, d);
    }
  } else if (opt == kRowwiseAdagrad) {
    float sum_sq = 0.0f;
    for (int64_t d = 0; d < D; ++d) sum_sq += rowwise_square(static_cast<float>(w[d]), g[d], p);
    m[0] = rowwise_accumulator(m[0], sum_sq, D);
    for (int64_t d = 0; d < D; ++d) {
      float x = static_cast<float>(w[d]);
      rowwise_element(x, g[d], m[0], p);
      w[d] = round_update<E>(x, r, d);
    }
  } else {
    float* __restrict__ v = m + D;
    for (int64_t d = 0; d < D; ++d) {
      float x = static_cast<float>(w[d]);
      adam_element(x, m[d], v[d], g[d], p);
      w[d] = round_update<E>(x, r, d);
    }
  }
}

void check_optimizer(const MetaView& mv, int64_t optimizer, int64_t weight_decay_mode,
                     int64_t step, const char* op) {
  DEMB_CHECK_VALUE(optimizer >= kSgd && optimizer <= kAdam, op,
                   ": optimizer must be 0 (SGD), 1 (ADAGRAD), 2 (ROWWISE_ADAGRAD) or 3 (ADAM), got ",
                   optimizer);
  DEMB_CHECK_VALUE(weight_decay_mode >= 0 && weight_decay_mode <= 2, op,
                   ": weight_decay_mode must be 0 (NONE), 1 (L2) or 2 (DECOUPLE), got ",
                   weight_decay_mode);
  DEMB_CHECK_VALUE(optimizer != kAdam || step >= 1, op,
                   ": step must be >= 1 for ADAM (bias correction), got ", step);
  for (int64_t t = 0; t < mv.T; ++t) {
    const int64_t need = mv.dim(t) + state_width(optimizer, mv.dim(t));
    DEMB_CHECK_VALUE(mv.lwidth(t) >= need, op, ": table ", t, "'s row_width ", mv.lwidth(t),
                     " is too small for dim ", mv.dim(t), " and its optimizer state (needs ",
                     need, ")");
  }
}

void grouped_update_cpu(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                        const at::Tensor& slots, const at::Tensor& grads, int64_t optimizer,
                        double lr, double eps, double beta1, double beta2, double weight_decay,
                        int64_t weight_decay_mode, int64_t step,
                        bool /*check: the CPU kernels always check*/, int64_t rounding_seed,
                        const std::optional<at::Tensor>& keys) {
  const char* op = "grouped_update";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_float_rows(grads, slots.numel(), values.device(), "grads", op);
  check_update_keys(keys, slots.numel(), rounding_seed, values.device(), op);
  const MetaView mv(meta, values.numel(), op, values.element_size());
  check_optimizer(mv, optimizer, weight_decay_mode, step, op);
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto g = grads.contiguous();
  const int64_t n = sl.numel(), G = g.size(1);
  const int64_t* t_p = tid.data_ptr<int64_t>();
  const int64_t* s_p = sl.data_ptr<int64_t>();
  check_rows(mv, t_p, s_p, n, op);
  for (int64_t i = 0; i < n; ++i) {
    DEMB_CHECK_VALUE(s_p[i] < 0 || mv.dim(t_p[i]) <= G, op, ": grads have ", G,
                     " columns, table ", t_p[i], " has dim ", mv.dim(t_p[i]));
  }
  const UpdateParams p = make_params(lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step,
                                       rounding_seed);
  const float* g_p = g.data_ptr<float>();
  const at::Tensor k = keys.has_value() ? keys->contiguous() : at::Tensor();
  const int64_t* k_p = k.defined() ? k.data_ptr<int64_t>() : nullptr;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
  using E = decltype(tag);
  E* v = values.data_ptr<E>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchAhead < end && s_p[i + kPrefetchAhead] >= 0) {
        const int64_t t = t_p[i + kPrefetchAhead];
        prefetch_row(v + mv.offset(t) + s_p[i + kPrefetchAhead] * mv.width(t), mv.width(t));
      }
      if (s_p[i] < 0) continue;
      const int64_t t = t_p[i];
      update_row(optimizer, v + mv.offset(t) + s_p[i] * mv.width(t), g_p + i * G, mv.dim(t), p,
                 row_rounding(p, t, k_p, i));
    }
  });
  });
}

// Reduction and update fused: each block of keys' gradients is applied right after the block is
// summed (a block's sums stay in cache), so the (u, D) gradient is never materialised; the rows
// come out bit-identical to grouped_reduce_grads followed by grouped_update.
void grouped_reduce_update_cpu(at::Tensor& values, const at::Tensor& meta,
                               const at::Tensor& table_ids, const at::Tensor& slots,
                               const at::Tensor& grad_out, const at::Tensor& inverse,
                               const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                               const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                               int64_t mode, int64_t batch_size, int64_t max_dim,
                               int64_t optimizer, double lr, double eps, double beta1,
                               double beta2, double weight_decay, int64_t weight_decay_mode,
                               int64_t step, bool /*check: the CPU kernels always check*/,
                               const std::optional<at::Tensor>& order,
                               const std::optional<at::Tensor>& key_counts,
                               int64_t rounding_seed, const std::optional<at::Tensor>& keys) {
  const char* op = "grouped_reduce_update";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_update_keys(keys, slots.numel(), rounding_seed, values.device(), op);
  // The key order spares the CUDA kernels a sort; this walk over the bags needs none.
  check_key_order(order, key_counts, inverse.numel(), slots.numel(), values.device(), op);
  const MetaView mv(meta, values.numel(), op, values.element_size());
  check_optimizer(mv, optimizer, weight_decay_mode, step, op);
  for (int64_t t = 0; t < mv.T; ++t) {
    DEMB_CHECK_VALUE(mv.dim(t) <= max_dim, op, ": max_dim ", max_dim, " is below table ", t,
                     "'s dim ", mv.dim(t));
  }
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const int64_t u = sl.numel();
  const int64_t* t_p = tid.data_ptr<int64_t>();
  const int64_t* s_p = sl.data_ptr<int64_t>();
  check_rows(mv, t_p, s_p, u, op);
  const UpdateParams p = make_params(lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step,
                                       rounding_seed);
  const at::Tensor kc = keys.has_value() ? keys->contiguous() : at::Tensor();
  const int64_t* k_p = kc.defined() ? kc.data_ptr<int64_t>() : nullptr;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
  using E = decltype(tag);
  E* v = values.data_ptr<E>();
  // The dedup's per-key counts (CPU forwards keep them) spare a one-table reduction its counting
  // pass; ``order`` (the CUDA sort's) is not needed here.
  const at::Tensor kcnt = key_counts.has_value() ? key_counts->contiguous() : at::Tensor();
  const int64_t* kc_p = kcnt.defined() ? kcnt.data_ptr<int64_t>() : nullptr;
  reduce_per_key(mv, grad_out, inverse, offsets, weights, feature_tables, d_offsets, mode,
                 batch_size, u, t_p, kc_p, op,
                 [&](int64_t k) DEMB_LAMBDA_INLINE { return s_p[k] >= 0; },
                 [&](int64_t k) DEMB_LAMBDA_INLINE {
                   const int64_t t = t_p[k];
                   if (s_p[k] >= 0) prefetch_row(v + mv.offset(t) + s_p[k] * mv.width(t), mv.width(t));
                 },
                 [&](int64_t k, const float* g, int64_t D) DEMB_LAMBDA_INLINE {
                   const int64_t t = t_p[k];
                   update_row(optimizer, v + mv.offset(t) + s_p[k] * mv.width(t), g, D, p,
                              row_rounding(p, t, k_p, k));
                 });
  });
}

}  // namespace
}  // namespace dynamicemb
