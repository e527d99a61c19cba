// The CPU grouped ops' shared pieces: prefetch distances, the checked view of meta (MetaView),
// logical row reads and writes, and the checked bag layout of the pooled gather and the reduction.
// Part of csrc/cpu/grouped.cpp's one translation unit (as csrc/cuda/table.cu's headers): included
// there and by the per-op headers grouped_*.h only.
#pragma once

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
inline void check_rows(const MetaView& mv, const int64_t* tids, const int64_t* slots, int64_t n,
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

/// Raises unless the bags' offsets run from 0 to n without decreasing (O(bags), before any walk).
inline void check_offsets(const int64_t* off, int64_t num_bags, int64_t n, const char* op) {
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

inline Bags bag_layout(const MetaView& mv, const at::Tensor& inverse, const at::Tensor& offsets,
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

}  // namespace
}  // namespace dynamicemb
