// CPU kernels of the grouped value ops: every op serves all tables of a group in one call, rows
// addressed by (table id, slot) through the (T, 4) metadata described in dynamicemb/grouped.h.
// Schemas: the "grouped" section of csrc/ops.cpp. CUDA twins: csrc/cuda/grouped.cu. The CPU
// kernels always check their data (it costs them no synchronisation) and raise before writing.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "dynamicemb/check.h"
#include "dynamicemb/cpu_isa.h"
#include "dynamicemb/grouped.h"
#include "dynamicemb/grouped_checks.h"
#include "dynamicemb/hashing.h"

namespace dynamicemb {
namespace {

using namespace grouped;

constexpr int64_t kPrefetchAhead = 8;
// Rows of the value buffer (random, often not in cache) are prefetched further ahead than the
// gradient rows (a small buffer): enough of them in flight to cover a memory read.
constexpr int64_t kRowsAhead = 16;
// Keys summed between two rounds of sinks (grouped_reduce_update's updates): 1024 rows of dim 128
// are 512 KiB, within a core's L2.
constexpr int64_t kKeyBlock = 1024;

template <typename E>
DEMB_ALWAYS_INLINE void prefetch_row(const E* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < n * int64_t(sizeof(E)); b += 64) __builtin_prefetch(p + b, 1, 3);
}

/// A host view of meta with range checks of (table id, slot) pairs.
struct MetaView {
  const int64_t* m;
  int64_t T;
  int64_t numel;  // elements of the values buffer
  int64_t esize;  // bytes per element of the values buffer (4, or 2 for a half-precision one)
  // numel < 0: no values buffer to bound the rows by (the reduction reads dims only).
  MetaView(const at::Tensor& meta, int64_t numel_, const char* op, int64_t esize_ = 4)
      : m(meta.data_ptr<int64_t>()), T(meta.size(0)), numel(numel_), esize(esize_) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t off = m[t * kMetaColumns + kMetaOffset], w = m[t * kMetaColumns + kMetaWidth];
      const int64_t cap = m[t * kMetaColumns + kMetaCapacity], d = m[t * kMetaColumns + kMetaDim];
      DEMB_CHECK_VALUE(off >= 0 && w >= 0 && cap >= 0 && d >= 0 && d <= w &&
                           (numel < 0 || off + w * cap <= numel),
                       op, ": meta row ", t, " = [", off, ", ", w, ", ", cap, ", ", d,
                       "] does not describe rows inside values (", numel, " elements)");
      DEMB_CHECK_VALUE(esize == 4 || row_layout_ok<at::Half>(off, w, d), op, ": meta row ", t,
                       " = [", off, ", ", w, ", ", cap, ", ", d, "] is not a half-precision row "
                       "layout (even offset and width, the embedding padded to an even dim)");
    }
  }
  /// Columns of table t's logical (float32) rows.
  int64_t lwidth(int64_t t) const {
    return esize == 4 ? width(t) : logical_width<at::Half>(width(t), dim(t));
  }
  int64_t offset(int64_t t) const { return m[t * kMetaColumns + kMetaOffset]; }
  int64_t width(int64_t t) const { return m[t * kMetaColumns + kMetaWidth]; }
  int64_t capacity(int64_t t) const { return m[t * kMetaColumns + kMetaCapacity]; }
  int64_t dim(int64_t t) const { return m[t * kMetaColumns + kMetaDim]; }
};

/// Raises IndexError for the first (table id, slot) outside the group; slots < 0 are allowed.
void check_rows(const MetaView& mv, const int64_t* tids, const int64_t* slots, int64_t n,
                const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    DEMB_CHECK_INDEX(tids[i] >= 0 && tids[i] < mv.T, op, ": table_ids[", i, "]=", tids[i],
                     " out of range [0, ", mv.T, ")");
    DEMB_CHECK_INDEX(slots[i] < mv.capacity(tids[i]), op, ": slots[", i, "]=", slots[i],
                     " out of range for table ", tids[i], " (capacity ", mv.capacity(tids[i]), ")");
  }
}

/// The first ``take`` columns of a stored row's logical (float32) form into ``dst``.
template <typename E>
inline void read_row(const E* row, int64_t D, int64_t take, float* dst) {
  if constexpr (sizeof(E) == 4) {
    std::copy(row, row + take, dst);
  } else {
    const int64_t e = std::min(D, take);
    for (int64_t d = 0; d < e; ++d) dst[d] = static_cast<float>(row[d]);
    if (take > D) std::copy(state_of(row, D), state_of(row, D) + (take - D), dst + D);
  }
}

/// A logical row of ``width`` columns into a stored row (the embedding rounded to ``E``).
template <typename E>
inline void write_row(E* row, int64_t D, int64_t width, const float* src) {
  if constexpr (sizeof(E) == 4) {
    std::copy(src, src + width, row);
  } else {
    for (int64_t d = 0; d < D; ++d) row[d] = to_row<E>(src[d]);
    if (emb_span<E>(D) > D) row[D] = E(0.0f);
    std::copy(src + D, src + width, state_of(row, D));
  }
}

at::Tensor grouped_gather_cpu(const at::Tensor& values, const at::Tensor& meta,
                              const at::Tensor& table_ids, const at::Tensor& slots, int64_t width,
                              bool /*check: the CPU kernels always check*/,
                              const std::optional<at::Tensor>& inverse) {
  const char* op = "grouped_gather";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_gather_inverse(inverse, values.device(), op);
  DEMB_CHECK_VALUE(width >= 0, op, ": width must be >= 0, got ", width);
  const MetaView mv(meta, values.numel(), op, values.element_size());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const int64_t u = sl.numel();
  const int64_t* t_p = tid.data_ptr<int64_t>();
  const int64_t* s_p = sl.data_ptr<int64_t>();
  check_rows(mv, t_p, s_p, u, op);
  const at::Tensor inv = inverse.has_value() ? inverse->contiguous() : at::Tensor();
  const int64_t* inv_p = inv.defined() ? inv.data_ptr<int64_t>() : nullptr;
  const int64_t n = inv.defined() ? inv.numel() : u;
  for (int64_t i = 0; inv_p != nullptr && i < n; ++i) {
    DEMB_CHECK_INDEX(inv_p[i] >= 0 && inv_p[i] < u, op, ": inverse[", i, "]=", inv_p[i],
                     " out of range [0, ", u, ")");
  }
  auto out = at::empty({n, width}, values.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    const E* v = values.data_ptr<E>();
    at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* dst = o + i * width;
        const int64_t j = inv_p != nullptr ? inv_p[i] : i;
        const int64_t t = t_p[j], s = s_p[j];
        const int64_t take = s < 0 ? 0 : std::min(width, mv.lwidth(t));
        if (take > 0) read_row(v + mv.offset(t) + s * mv.width(t), mv.dim(t), take, dst);
        std::fill(dst + take, dst + width, 0.0f);
      }
    });
  });
  return out;
}

void grouped_scatter_cpu(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                         const at::Tensor& slots, const at::Tensor& rows,
                         bool /*check: the CPU kernels always check*/) {
  const char* op = "grouped_scatter";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_float_rows(rows, slots.numel(), values.device(), "rows", op);
  const MetaView mv(meta, values.numel(), op, values.element_size());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto r = rows.contiguous();
  const int64_t n = sl.numel(), R = r.size(1);
  const int64_t* t_p = tid.data_ptr<int64_t>();
  const int64_t* s_p = sl.data_ptr<int64_t>();
  check_rows(mv, t_p, s_p, n, op);
  for (int64_t i = 0; i < n; ++i) {
    DEMB_CHECK_VALUE(s_p[i] < 0 || mv.lwidth(t_p[i]) <= R, op, ": rows have ", R,
                     " columns, table ", t_p[i], " needs ", mv.lwidth(t_p[i]));
  }
  const float* src = r.data_ptr<float>();
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    E* v = values.data_ptr<E>();
    // Serial: duplicate (table, slot) pairs then write in order, the last one winning.
    for (int64_t i = 0; i < n; ++i) {
      if (s_p[i] < 0) continue;
      const int64_t t = t_p[i];
      write_row(v + mv.offset(t) + s_p[i] * mv.width(t), mv.dim(t), mv.lwidth(t), src + i * R);
    }
  });
}

/// Raises unless every initializer row has a known mode (row_init.h).
void check_init_modes(const double* init, int64_t T, const char* op) {
  for (int64_t t = 0; t < T; ++t) {
    const double mode = init[t * kInitColumns];
    DEMB_CHECK_VALUE(mode == double(int64_t(mode)) && mode >= double(kInitConstant) &&
                         mode <= double(kInitTruncatedNormal),
                     op, ": init row ", t, " has no initializer mode (got ", mode, ")");
  }
}

void grouped_init_rows_cpu(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                           const at::Tensor& slots, const at::Tensor& keys, const at::Tensor& init,
                           int64_t seed, bool /*check: the CPU kernels always check*/,
                           const std::optional<at::Tensor>& only_in) {
  const char* op = "grouped_init_rows";
  const at::Tensor only =
      check_init_rows_args(values, meta, table_ids, slots, keys, init, only_in, op);
  const int64_t n = slots.numel();
  const bool* o_p = only.defined() ? only.data_ptr<bool>() : nullptr;
  const MetaView mv(meta, values.numel(), op, values.element_size());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto k = keys.contiguous();
  const auto in = init.contiguous();
  const int64_t* t_p = tid.data_ptr<int64_t>();
  const int64_t* s_p = sl.data_ptr<int64_t>();
  const int64_t* k_p = k.data_ptr<int64_t>();
  const double* in_p = in.data_ptr<double>();
  check_rows(mv, t_p, s_p, n, op);
  check_init_modes(in_p, mv.T, op);
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    E* v = values.data_ptr<E>();
    at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (s_p[i] < 0 || (o_p != nullptr && !o_p[i])) continue;
        const int64_t t = t_p[i], D = mv.dim(t), L = mv.lwidth(t);
        const double* p = in_p + t * kInitColumns;
        const uint64_t stream = init_stream(seed, t, k_p[i]);
        E* row = v + mv.offset(t) + s_p[i] * mv.width(t);
        for (int64_t d = 0; d < D; ++d) row[d] = to_row<E>(init_value(p, stream, k_p[i], d));
        if constexpr (sizeof(E) != 4) {
          if (emb_span<E>(D) > D) row[D] = E(0.0f);
        }
        float* state = state_of(row, D);
        for (int64_t d = D; d < L; ++d) state[d - D] = float(p[kInitState]);
      }
    });
  });
}

/// Raises unless the bags' offsets run from 0 to n without decreasing (O(bags), before any walk).
void check_offsets(const int64_t* off, int64_t num_bags, int64_t n, const char* op) {
  DEMB_CHECK_VALUE(off[0] == 0 && off[num_bags] == n, op, ": offsets must start at 0 and end at n=",
                   n, ", got [", off[0], ", ...,", off[num_bags], "]");
  for (int64_t b = 0; b < num_bags; ++b) {
    DEMB_CHECK_VALUE(off[b] <= off[b + 1], op, ": offsets must be non-decreasing; offsets[", b,
                     "]=", off[b], " > offsets[", b + 1, "]=", off[b + 1]);
  }
}

/// The bag layout shared by the pooled gather and the reduction, checked.
struct Bags {
  at::Tensor inv, off, ft, dofs, w;
  const int64_t *inv_p, *off_p, *ft_p, *dofs_p;
  const float* w_p;
  int64_t n, num_bags, F, B;
};

Bags bag_layout(const MetaView& mv, const at::Tensor& inverse, const at::Tensor& offsets,
                const std::optional<at::Tensor>& weights, const at::Tensor& feature_tables,
                const at::Tensor& d_offsets, int64_t mode, int64_t batch_size, int64_t num_unique,
                const char* op) {
  check_group_bags(inverse, offsets, weights, feature_tables, d_offsets, mode, batch_size, op);
  Bags b;
  b.inv = inverse.contiguous();
  b.off = offsets.contiguous();
  b.ft = feature_tables.contiguous();
  b.dofs = d_offsets.contiguous();
  b.w = weights.has_value() ? weights->contiguous() : at::Tensor();
  b.inv_p = b.inv.data_ptr<int64_t>();
  b.off_p = b.off.data_ptr<int64_t>();
  b.ft_p = b.ft.data_ptr<int64_t>();
  b.dofs_p = b.dofs.data_ptr<int64_t>();
  b.w_p = b.w.defined() ? b.w.data_ptr<float>() : nullptr;
  b.n = b.inv.numel();
  b.num_bags = b.off.numel() - 1;
  b.F = b.ft.numel();
  b.B = batch_size;
  for (int64_t f = 0; f < b.F; ++f) {
    DEMB_CHECK_INDEX(b.ft_p[f] >= 0 && b.ft_p[f] < mv.T, op, ": feature_tables[", f, "]=",
                     b.ft_p[f], " out of range [0, ", mv.T, ")");
    DEMB_CHECK_VALUE(b.dofs_p[f + 1] - b.dofs_p[f] == mv.dim(b.ft_p[f]) || mode == kPoolNone, op,
                     ": d_offsets must step by each feature's table dim; feature ", f, " steps ",
                     b.dofs_p[f + 1] - b.dofs_p[f], ", its table's dim is ", mv.dim(b.ft_p[f]));
  }
  check_offsets(b.off_p, b.num_bags, b.n, op);
  (void)num_unique;  // inverse is range-checked by the walk that follows it
  return b;
}

/// Raises for inverse[i] outside [0, num_unique).
inline void check_inverse(const int64_t* inv, int64_t i, int64_t num_unique, const char* op) {
  DEMB_CHECK_INDEX(inv[i] >= 0 && inv[i] < num_unique, op, ": inverse[", i, "]=", inv[i],
                   " out of range [0, ", num_unique, ")");
}

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

/// Hash of a (table id, key) pair: the key's hash mixed with the table id times an odd constant.
DEMB_ALWAYS_INLINE uint64_t pair_hash(int64_t key, int64_t tid) {
  return hash_key(key) ^ (static_cast<uint64_t>(tid) * 0x9E3779B97F4A7C15ULL);
}

// The probe array's size for the next batch: twice the unique pairs the previous batch of this
// thread found, plus a quarter (a training loop's batches are alike); a batch with more pairs
// doubles the array as it fills. Only speed depends on it: the pairs, their order and the inverse
// are the same whatever the array's size.
thread_local int64_t t_last_unique = 0;

/// One slot of the dedup's probe array: a pair and its unique id (id < 0: empty). ``Index`` is
/// int32 for batches below 2^31 ids and fewer than 2^31 tables (16-byte slots, four to a line).
template <typename Index>
struct ProbeSlot {
  int64_t key;
  Index tid, id;
};

/// The dedup's answer: the pairs in order of first occurrence and each one's count.
template <typename Index>
struct Dedup {
  std::vector<int64_t> keys;
  std::vector<Index> tids, counts;
};

// The open-addressing dedup of segmented_unique_cpu, in one serial pass in input order. Each probe
// slot holds its pair itself (key, table id, unique id), so a probe waits on one random read, the
// slot's line, prefetched 2 x kPrefetchAhead positions ahead (its hash kept in a ring, computed
// once); the counts live in their own array by unique id (hot keys' counts stay in L1). The array
// is sized from the previous batch's pairs, not from the batch (a batch repeats its hot keys, so
// its pairs are often a small part of its ids: an array sized by the ids would be mostly empty
// lines), and kept at most half full. ``kOneTable``: every table id is ``tp[0]``, checked by the
// caller (a one-table group: no table id is read or compared per index). Otherwise table ids are
// checked as they are read (the outputs are new tensors: raising midway leaves nothing written).
template <typename Index, bool kOneTable>
Dedup<Index> dedup_pairs(const int64_t* kp, const int64_t* tp, int64_t n, int64_t num_tables,
                         int64_t* inv, int64_t* tc, const char* op) {
  using Slot = ProbeSlot<Index>;
  int64_t cap = 1024;
  const int64_t want = 2 * (t_last_unique + t_last_unique / 4);
  while (cap < 2 * n && cap < want) cap <<= 1;
  uint64_t mask = static_cast<uint64_t>(cap - 1);
  std::vector<Slot> slots(cap, Slot{0, 0, Index(-1)});
  Dedup<Index> out;
  const int64_t expect = std::min(n, std::max<int64_t>(1024, want));
  out.keys.reserve(expect);
  out.tids.reserve(expect);
  out.counts.reserve(expect);
  int64_t size = 0;
  // Half full: double the array and place the pairs found so far again.
  auto grow = [&] {
    cap *= 2;
    mask = static_cast<uint64_t>(cap - 1);
    slots.assign(cap, Slot{0, 0, Index(-1)});
    for (int64_t id = 0; id < size; ++id) {
      uint64_t h = pair_hash(out.keys[id], out.tids[id]) & mask;
      while (slots[h].id >= 0) h = (h + 1) & mask;
      slots[h] = Slot{out.keys[id], out.tids[id], static_cast<Index>(id)};
    }
  };
  const int64_t t0 = n > 0 ? tp[0] : 0;
  auto tid_at = [&](int64_t i) DEMB_LAMBDA_INLINE { return kOneTable ? t0 : tp[i]; };
  constexpr int64_t kFar = 2 * kPrefetchAhead, kRing = 4 * kPrefetchAhead;  // kRing: power of 2
  uint64_t ring[kRing];
  for (int64_t i = 0; i < std::min(n, kFar); ++i) ring[i % kRing] = pair_hash(kp[i], tid_at(i));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kFar < n) {
      const uint64_t h = pair_hash(kp[i + kFar], tid_at(i + kFar));
      ring[(i + kFar) % kRing] = h;
      __builtin_prefetch(&slots[h & mask], 0, 3);
    }
    const int64_t key = kp[i], t = tid_at(i);
    if constexpr (!kOneTable) {
      DEMB_CHECK_INDEX(t >= 0 && t < num_tables, op, ": table_ids[", i, "]=", t,
                       " out of range [0, ", num_tables, ")");
    }
    uint64_t h = ring[i % kRing] & mask;
    while (true) {
      const Slot& sl = slots[h];
      if (__builtin_expect(sl.id < 0, 0)) {
        if (2 * (size + 1) > cap) {  // half full: grow, then look for this absent pair's slot
          grow();
          h = ring[i % kRing] & mask;
          while (slots[h].id >= 0) h = (h + 1) & mask;
        }
        slots[h] = Slot{key, static_cast<Index>(t), static_cast<Index>(size)};
        inv[i] = size;
        out.keys.push_back(key);
        out.tids.push_back(static_cast<Index>(t));
        out.counts.push_back(1);
        ++size;
        ++tc[t];
        break;
      }
      if (sl.key == key && (kOneTable || sl.tid == t)) {
        inv[i] = sl.id;
        ++out.counts[sl.id];
        break;
      }
      h = (h + 1) & mask;
    }
  }
  t_last_unique = size;
  return out;
}

/// Raises unless every one of the n table ids is ``0`` (the one table of a one-table group): one
/// tight pass before the dedup, which then reads no table id.
void check_one_table(const int64_t* tp, int64_t n, const char* op) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= tp[i];
  if (bad == 0) return;
  for (int64_t i = 0; i < n; ++i) {
    DEMB_CHECK_INDEX(tp[i] == 0, op, ": table_ids[", i, "]=", tp[i], " out of range [0, 1)");
  }
}

/// The dedup's pairs into segmented_unique's (u,) keys, table ids and counts.
template <typename Index>
void write_pairs(const Dedup<Index>& d, int64_t* ok, int64_t* ot, int64_t* oc) {
  const int64_t m = static_cast<int64_t>(d.keys.size());
  std::copy(d.keys.begin(), d.keys.end(), ok);
  for (int64_t u = 0; u < m; ++u) {
    ot[u] = d.tids[u];
    oc[u] = d.counts[u];
  }
}

// Deduplicates (table id, key) pairs with an open-addressing hash set, in one serial pass: pairs
// come out in order of first occurrence (deterministic, as the per-table unique).
using UniqueResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

/// (n,) positions grouped by unique id, each group in input order: a counting sort of the inverse.
at::Tensor positions_by_key(const at::Tensor& inverse, const at::Tensor& counts) {
  const int64_t n = inverse.numel(), u = counts.numel();
  std::vector<int64_t> next(u);
  const int64_t* c = counts.data_ptr<int64_t>();
  int64_t run = 0;
  for (int64_t k = 0; k < u; ++k) {
    next[k] = run;
    run += c[k];
  }
  auto order = at::empty({n}, inverse.options());
  int64_t* o = order.data_ptr<int64_t>();
  const int64_t* inv = inverse.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[next[inv[i]]++] = i;
  return order;
}

/// The dedup of (n,) pairs; ``extra`` (k,) int64 numbers (or undefined) follow the per-table
/// counts in the fifth output.
UniqueResult unique_pairs_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                              int64_t num_tables, bool with_order, const at::Tensor& extra,
                              const char* op) {
  const auto k = keys.contiguous();
  const auto tid = table_ids.contiguous();
  const int64_t n = k.numel();
  const int64_t* kp = k.data_ptr<int64_t>();
  const int64_t* tp = tid.data_ptr<int64_t>();
  auto inverse = at::empty({n}, k.options());
  auto table_counts = at::zeros({num_tables}, k.options());
  int64_t* inv = inverse.data_ptr<int64_t>();
  int64_t* tc = table_counts.data_ptr<int64_t>();
  constexpr int64_t kNarrow = std::numeric_limits<int32_t>::max();
  at::Tensor out_keys, out_tids, out_counts;
  auto emit = [&](const auto& pairs) {
    const int64_t m = static_cast<int64_t>(pairs.keys.size());
    out_keys = at::empty({m}, k.options());
    out_tids = at::empty({m}, k.options());
    out_counts = at::empty({m}, k.options());
    write_pairs(pairs, out_keys.data_ptr<int64_t>(), out_tids.data_ptr<int64_t>(),
                out_counts.data_ptr<int64_t>());
  };
  if (num_tables == 1) check_one_table(tp, n, op);
  if (n < kNarrow && num_tables == 1) {
    emit(dedup_pairs<int32_t, true>(kp, tp, n, num_tables, inv, tc, op));
  } else if (n < kNarrow && num_tables < kNarrow) {
    emit(dedup_pairs<int32_t, false>(kp, tp, n, num_tables, inv, tc, op));
  } else {
    emit(dedup_pairs<int64_t, false>(kp, tp, n, num_tables, inv, tc, op));
  }
  at::Tensor order = with_order ? positions_by_key(inverse, out_counts) : k.new_empty({0});
  if (extra.defined()) table_counts = at::cat({table_counts, extra});
  return {out_keys, out_tids, inverse, out_counts, table_counts, order};
}

UniqueResult segmented_unique_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                                  int64_t num_tables, bool with_order) {
  const char* op = "segmented_unique";
  check_segmented_unique(keys, table_ids, num_tables, op);
  return unique_pairs_cpu(keys, table_ids, num_tables, with_order, at::Tensor(), op);
}

/// (n,) table of each index of a feature-major batch and the offsets check's numbers (3,):
/// [offsets[0], offsets[-1], bags whose offsets decrease], in one pass over the offsets.
std::tuple<at::Tensor, at::Tensor> bag_table_ids(const at::Tensor& offsets,
                                                 const at::Tensor& feature_tables,
                                                 int64_t batch_size, int64_t n) {
  const auto off = offsets.contiguous();
  const auto ft = feature_tables.contiguous();
  const int64_t F = ft.numel();
  const int64_t* o = off.data_ptr<int64_t>();
  const int64_t* f = ft.data_ptr<int64_t>();
  const int64_t bags = off.numel() - 1;
  int64_t decreasing = 0;
  for (int64_t b = 0; b < bags; ++b) decreasing += o[b + 1] < o[b] ? 1 : 0;
  // Offsets from 0 to n that never decrease: the features' ranges tile [0, n), every index is
  // written below. Otherwise zeros first: indices no feature's range covers get table 0.
  const bool tiled = o[0] == 0 && o[bags] == n && decreasing == 0;
  auto out = tiled ? at::empty({n}, off.options()) : at::zeros({n}, off.options());
  int64_t* t = out.data_ptr<int64_t>();
  for (int64_t j = 0; j < F; ++j) {
    // Clamped to [0, n]: the offsets are the caller's to check; nothing is written out of bounds.
    const int64_t lo = std::clamp<int64_t>(o[j * batch_size], 0, n);
    const int64_t hi = std::clamp<int64_t>(o[(j + 1) * batch_size], lo, n);
    std::fill(t + lo, t + hi, f[j]);
  }
  auto flags = at::empty({3}, off.options());
  int64_t* fl = flags.data_ptr<int64_t>();
  fl[0] = o[0];
  fl[1] = o[bags];
  fl[2] = decreasing;
  return {out, flags};
}

UniqueResult bag_unique_cpu(const at::Tensor& keys, const at::Tensor& offsets,
                            const at::Tensor& feature_tables, int64_t batch_size,
                            int64_t num_tables, bool with_order) {
  const char* op = "bag_unique";
  check_bag_unique(keys, offsets, feature_tables, batch_size, num_tables, op);
  const auto [tids, numbers] = bag_table_ids(offsets, feature_tables, batch_size, keys.numel());
  return unique_pairs_cpu(keys, tids, num_tables, with_order, numbers, op);
}

at::Tensor placement_counts_cpu(const at::Tensor& table_ids, const at::Tensor& slots,
                                const at::Tensor& is_new, const at::Tensor& sizes) {
  const char* op = "placement_counts";
  check_placement_counts(table_ids, slots, is_new, sizes, op);
  const auto sz = sizes.contiguous();
  const int64_t num_tables = sz.numel();
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto nw = is_new.contiguous();
  const int64_t* t = tid.data_ptr<int64_t>();
  const int64_t* s = sl.data_ptr<int64_t>();
  const bool* w = nw.data_ptr<bool>();
  auto out = at::zeros({num_tables, 3}, tid.options());
  int64_t* c = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < sl.numel(); ++i) {
    if (t[i] < 0 || t[i] >= num_tables) continue;
    if (s[i] < 0) {
      ++c[t[i] * 3 + 1];
    } else if (w[i]) {
      ++c[t[i] * 3];
    }
  }
  const int64_t* z = sz.data_ptr<int64_t>();
  for (int64_t j = 0; j < num_tables; ++j) c[j * 3 + 2] = z[j];
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("segmented_unique", &segmented_unique_cpu);
  m.impl("bag_unique", &bag_unique_cpu);
  m.impl("placement_counts", &placement_counts_cpu);
  m.impl("grouped_gather", &grouped_gather_cpu);
  m.impl("grouped_scatter", &grouped_scatter_cpu);
  m.impl("grouped_init_rows", &grouped_init_rows_cpu);
  m.impl("grouped_pooled_gather", &grouped_pooled_gather_cpu);
  m.impl("grouped_reduce_grads", &grouped_reduce_grads_cpu);
  m.impl("grouped_update", &grouped_update_cpu);
  m.impl("grouped_reduce_update", &grouped_reduce_update_cpu);
}

}  // namespace dynamicemb
