// grouped_gather, grouped_scatter and grouped_init_rows on CPU: rows addressed by (table id, slot).
// Part of csrc/cpu/grouped.cpp's one translation unit (as csrc/cuda/table.cu's headers): included
// there only, after grouped_common.h.
#pragma once

#include "grouped_common.h"

namespace dynamicemb {
namespace {

using namespace grouped;

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

}  // namespace
}  // namespace dynamicemb
