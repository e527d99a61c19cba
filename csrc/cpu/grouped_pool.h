// grouped_pooled_gather on CPU: each bag's rows pooled into its feature's columns of the output.
// Part of csrc/cpu/grouped.cpp's one translation unit (as csrc/cuda/table.cu's headers): included
// there only, after grouped_common.h.
#pragma once

#include "grouped_common.h"

namespace dynamicemb {
namespace {

using namespace grouped;

/// One grouped_pooled_gather call's inputs, for its bag loop (pool_bags).
template <typename E>
struct PoolJob {
  const MetaView* mv;
  const Bags* b;
  const int64_t* slots;
  int64_t u, mode, total_dim;
  const E* values;
  float* out;
};

/// Prefetches, a fixed number of indices ahead of the pooling walk, the row that index reads.
/// Its cursor follows the features (a feature's bags are one contiguous run of indices, all of
/// one table), so finding an index's table costs one compare, not a division or a bag walk.
template <typename E>
struct RowPrefetcher {
  const PoolJob<E>& j;
  int64_t last;          // first index past the walk's bags
  int64_t feature;       // the feature of the indices the cursor is in
  int64_t feature_end;   // first index past that feature's bags
  const E* base;         // that feature's table: its rows, width, capacity, dim
  int64_t width, cap, dim;

  RowPrefetcher(const PoolJob<E>& job, int64_t first_bag, int64_t end_bag)
      : j(job), last(job.b->off_p[end_bag]), feature(first_bag / job.b->B) {
    enter(feature);
  }
  DEMB_ALWAYS_INLINE void enter(int64_t f) {
    const Bags& b = *j.b;
    feature = f;
    feature_end = f + 1 < b.F ? b.off_p[(f + 1) * b.B] : b.n;
    const int64_t t = b.ft_p[f];  // f < F: the walk ends at or before the last feature's end
    base = j.values + j.mv->offset(t);
    width = j.mv->width(t);
    cap = j.mv->capacity(t);
    dim = j.mv->dim(t);
  }
  DEMB_ALWAYS_INLINE void at(int64_t ahead) {
    if (ahead >= last) return;
    // the slot of the index one distance further on: read (not waited for) when its row is due
    const int64_t further = ahead + kRowsAhead;
    if (further < last) {
      const int64_t kf = j.b->inv_p[further];
      if (kf >= 0 && kf < j.u) __builtin_prefetch(j.slots + kf);
    }
    while (ahead >= feature_end) enter(feature + 1);
    const int64_t k = j.b->inv_p[ahead];
    if (k < 0 || k >= j.u) return;
    const int64_t s = j.slots[k];
    if (s >= 0 && s < cap) prefetch_row(base + s * width, dim);
  }
};

/// Pools one bag into ``dst``: ``FD`` > 0 is the table's dim known at compile time (the sums stay
/// in registers and the loops unroll), 0 a dim read from meta. ``kWeighted``: per-sample weights
/// (else each row is added as it is: the product by a weight of 1 changes no bit). Returns whether
/// an index had a unique id or slot out of range (skipped; the caller raises for it).
template <typename E, int64_t FD, bool kWeighted>
DEMB_ALWAYS_INLINE bool pool_bag(const PoolJob<E>& j, int64_t bag, RowPrefetcher<E>& pf,
                                 float* scratch) {
  const Bags& b = *j.b;
  const MetaView& mv = *j.mv;
  const int64_t f = bag / b.B, t = b.ft_p[f];
  const int64_t D = FD > 0 ? FD : mv.dim(t), W = mv.width(t), cap = mv.capacity(t);
  const E* base = j.values + mv.offset(t);
  float local[FD > 0 ? FD : 1];
  float* __restrict__ a = FD > 0 ? local : scratch;
  for (int64_t d = 0; d < D; ++d) a[d] = 0.0f;
  bool bad = false;
  const int64_t lo = b.off_p[bag], hi = b.off_p[bag + 1];
  for (int64_t i = lo; i < hi; ++i) {
    pf.at(i + kRowsAhead);
    const int64_t k = b.inv_p[i];
    if (k < 0 || k >= j.u) {
      bad = true;
      continue;
    }
    const int64_t slot = j.slots[k];
    if (slot < 0) continue;
    if (slot >= cap) {
      bad = true;
      continue;
    }
    const E* __restrict__ row = base + slot * W;
    if constexpr (kWeighted) {
      const float w = b.w_p[i];
      for (int64_t d = 0; d < D; ++d) a[d] += w * static_cast<float>(row[d]);
    } else {
      for (int64_t d = 0; d < D; ++d) a[d] += static_cast<float>(row[d]);
    }
  }
  float* dst = j.out + (bag % b.B) * j.total_dim + b.dofs_p[f];
  if (j.mode == kPoolMean && hi > lo) {
    const float scale = 1.0f / float(hi - lo);
    for (int64_t d = 0; d < D; ++d) dst[d] = a[d] * scale;
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = a[d];
  }
  return bad;
}

/// Bags [begin, end) of grouped_pooled_gather; float rows of the common dims get a compiled dim.
template <typename E, bool kWeighted>
DEMB_ALWAYS_INLINE bool pool_bags(const PoolJob<E>& j, int64_t begin, int64_t end) {
  const Bags& b = *j.b;
  std::vector<float> scratch;
  RowPrefetcher<E> pf(j, begin, end);
  bool bad = false;
  for (int64_t bag = begin; bag < end; ++bag) {
    const int64_t D = j.mv->dim(b.ft_p[bag / b.B]);
    if constexpr (sizeof(E) == 4) {
      switch (D) {
        case 16: bad |= pool_bag<E, 16, kWeighted>(j, bag, pf, nullptr); continue;
        case 32: bad |= pool_bag<E, 32, kWeighted>(j, bag, pf, nullptr); continue;
        case 64: bad |= pool_bag<E, 64, kWeighted>(j, bag, pf, nullptr); continue;
        case 128: bad |= pool_bag<E, 128, kWeighted>(j, bag, pf, nullptr); continue;
        default: break;
      }
    }
    if (static_cast<int64_t>(scratch.size()) < D) scratch.resize(D);
    bad |= pool_bag<E, 0, kWeighted>(j, bag, pf, scratch.data());
  }
  return bad;
}

template <typename E>
bool pool_bags_plain(const PoolJob<E>& j, int64_t begin, int64_t end) {
  return j.b->w_p ? pool_bags<E, true>(j, begin, end) : pool_bags<E, false>(j, begin, end);
}

#ifdef DEMB_CPU_AVX2
DEMB_TARGET_AVX2 bool pool_bags_avx2(const PoolJob<float>& j, int64_t begin, int64_t end) {
  return j.b->w_p ? pool_bags<float, true>(j, begin, end) : pool_bags<float, false>(j, begin, end);
}
#endif

/// pool_bags on the widest clone this CPU runs (float rows; half-precision rows: the plain one).
template <typename E>
bool run_pool_bags(const PoolJob<E>& j, int64_t begin, int64_t end) {
#ifdef DEMB_CPU_AVX2
  if constexpr (sizeof(E) == 4) {
    if (cpu_has_avx2()) return pool_bags_avx2(j, begin, end);
  }
#endif
  return pool_bags_plain(j, begin, end);
}

at::Tensor grouped_pooled_gather_cpu(const at::Tensor& values, const at::Tensor& meta,
                                     const at::Tensor& slots, const at::Tensor& inverse,
                                     const at::Tensor& offsets,
                                     const std::optional<at::Tensor>& weights,
                                     const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                                     int64_t mode, int64_t batch_size, int64_t total_dim,
                                     bool /*check: the CPU kernels always check*/) {
  const char* op = "grouped_pooled_gather";
  check_group(values, meta, op);
  DEMB_CHECK_VALUE(mode == kPoolSum || mode == kPoolMean, op, ": mode must be 0 (SUM) or 1 (MEAN), got ", mode);
  DEMB_CHECK_TYPE(slots.scalar_type() == at::kLong && slots.dim() == 1, op,
                  ": slots must be (u,) int64, got ", slots.sizes(), " ", slots.scalar_type());
  const MetaView mv(meta, values.numel(), op, values.element_size());
  const auto sl = slots.contiguous();
  const int64_t u = sl.numel();
  const Bags b = bag_layout(mv, inverse, offsets, weights, feature_tables, d_offsets, mode,
                            batch_size, u, op);
  DEMB_CHECK_VALUE(b.dofs_p[b.F] == total_dim, op, ": total_dim ", total_dim,
                   " differs from d_offsets[-1]=", b.dofs_p[b.F]);
  const int64_t* s_p = sl.data_ptr<int64_t>();
  // The walk checks each index's unique id and slot as it reads them, skipping a bad one; the
  // output is new, so raising after the walk still writes nothing the caller sees.
  auto check_index = [&](int64_t bag, int64_t i) {
    check_inverse(b.inv_p, i, u, op);
    const int64_t t = b.ft_p[bag / b.B];
    DEMB_CHECK_INDEX(s_p[b.inv_p[i]] < mv.capacity(t), op, ": slot ", s_p[b.inv_p[i]],
                     " of index ", i, " out of range for table ", t, " (capacity ",
                     mv.capacity(t), ")");
  };
  std::atomic<bool> bad{false};
  auto out = at::empty({b.B, total_dim}, values.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    const PoolJob<E> job{&mv, &b, s_p, u, mode, total_dim, values.data_ptr<E>(), o};
    at::parallel_for(0, b.num_bags, 64, [&](int64_t begin, int64_t end) {
      if (run_pool_bags(job, begin, end)) bad.store(true, std::memory_order_relaxed);
    });
  });
  if (bad.load()) {
    // Error path only: find the first bad index, in index order, and raise for it.
    for (int64_t bag = 0; bag < b.num_bags; ++bag) {
      for (int64_t i = b.off_p[bag]; i < b.off_p[bag + 1]; ++i) check_index(bag, i);
    }
  }
  return out;
}

}  // namespace
}  // namespace dynamicemb
