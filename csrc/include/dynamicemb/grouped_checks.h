/**
 * @file grouped_checks.h
 * @brief Argument checks of the grouped value ops (dtypes, shapes, devices), shared by the CPU and
 *        CUDA kernels so both raise the same errors for the same bad input. Data checks (slots and
 *        table ids in range, offsets ordered) need the values and run where the data lives.
 */
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "dynamicemb/bag_checks.h"
#include "dynamicemb/check.h"
#include "dynamicemb/grouped.h"
#include "dynamicemb/row_init.h"

namespace dynamicemb {

/// ``meta``: a contiguous (T, 4) int64 tensor on ``device``.
inline void check_meta(const at::Tensor& meta, const at::Device& device, const char* op) {
  DEMB_CHECK_TYPE(meta.scalar_type() == at::kLong, op, ": meta must be int64, got ",
                  meta.scalar_type());
  DEMB_CHECK_VALUE(meta.dim() == 2 && meta.size(1) == grouped::kMetaColumns && meta.is_contiguous(),
                   op, ": meta must be a contiguous (T, 4) tensor [value_offset, row_width, "
                   "capacity, dim], got ", meta.sizes());
  check_on_device(meta, device, "meta", op);
}

/// Whether ``t`` is a row element type of the grouped ops (grouped.h): float32, float16, bfloat16.
inline bool is_row_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

/// Calls ``f(E{})`` with ``E`` the C++ type of row dtype ``t`` (float, at::Half, at::BFloat16).
template <typename F>
void dispatch_rows(at::ScalarType t, F&& f) {
  if (t == at::kHalf) {
    f(at::Half{});
  } else if (t == at::kBFloat16) {
    f(at::BFloat16{});
  } else {
    f(float{});
  }
}

/// ``values``: the group's flat, contiguous buffer of a row type; ``meta`` describes it.
inline void check_group(const at::Tensor& values, const at::Tensor& meta, const char* op) {
  DEMB_CHECK_TYPE(is_row_type(values.scalar_type()), op,
                  ": values must be float32, float16 or bfloat16, got ", values.scalar_type());
  DEMB_CHECK_VALUE(values.dim() == 1 && values.is_contiguous(), op,
                   ": values must be a contiguous 1-D buffer, got ", values.sizes());
  check_meta(meta, values.device(), op);
}

/// ``table_ids`` and ``slots``: (n,) int64 on ``device``.
inline void check_row_ids(const at::Tensor& table_ids, const at::Tensor& slots,
                          const at::Device& device, const char* op) {
  DEMB_CHECK_TYPE(table_ids.scalar_type() == at::kLong && slots.scalar_type() == at::kLong, op,
                  ": table_ids and slots must be int64, got ", table_ids.scalar_type(), " and ",
                  slots.scalar_type());
  DEMB_CHECK_VALUE(table_ids.dim() == 1 && slots.dim() == 1 && table_ids.numel() == slots.numel(),
                   op, ": table_ids and slots must be (n,) of one length, got ",
                   table_ids.sizes(), " and ", slots.sizes());
  check_on_device(table_ids, device, "table_ids", op);
  check_on_device(slots, device, "slots", op);
}

/// ``rows``: (n, k) float32 on ``device``.
inline void check_float_rows(const at::Tensor& rows, int64_t n, const at::Device& device,
                             const char* name, const char* op) {
  DEMB_CHECK_TYPE(rows.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                  rows.scalar_type());
  DEMB_CHECK_VALUE(rows.dim() == 2 && rows.size(0) == n, op, ": ", name, " must be (", n,
                   ", k), got ", rows.sizes());
  check_on_device(rows, device, name, op);
}

/// The update ops' ``keys``: each updated row's key, which (not the row's slot) keys its stochastic
/// rounding (grouped.h's row_rounding). Required when ``rounding_seed`` >= 0, optional otherwise;
/// (n,) int64 on ``device``, one per slot.
inline void check_update_keys(const std::optional<at::Tensor>& keys, int64_t n,
                              int64_t rounding_seed, const at::Device& device, const char* op) {
  DEMB_CHECK_VALUE(keys.has_value() || rounding_seed < 0, op, ": rounding_seed ", rounding_seed,
                   " (stochastic rounding) needs the rows' keys (keys=None)");
  if (!keys.has_value()) return;
  DEMB_CHECK_TYPE(keys->scalar_type() == at::kLong, op, ": keys must be int64, got ",
                  keys->scalar_type());
  DEMB_CHECK_VALUE(keys->dim() == 1 && keys->numel() == n, op, ": keys must be (", n,
                   ",), one per slot, got ", keys->sizes());
  check_on_device(*keys, device, "keys", op);
}

/// grouped_init_rows' ``keys`` (n,) int64 and ``init`` (T, 8) float64 (row_init.h), on ``device``.
inline void check_init_keys(const at::Tensor& keys, const at::Tensor& init, int64_t n, int64_t T,
                            const at::Device& device, const char* op) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong, op, ": keys must be int64, got ",
                  keys.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1 && keys.numel() == n, op, ": keys must be (", n,
                   ",), one per slot, got ", keys.sizes());
  DEMB_CHECK_TYPE(init.scalar_type() == at::kDouble, op, ": init must be float64, got ",
                  init.scalar_type());
  DEMB_CHECK_VALUE(init.dim() == 2 && init.size(0) == T && init.size(1) == grouped::kInitColumns,
                   op, ": init must be (", T, ", ", grouped::kInitColumns, "), got ", init.sizes());
  check_on_device(keys, device, "keys", op);
  check_on_device(init, device, "init", op);
}

/// grouped_init_rows' ``only``: (n,) bool on the rows' device, or none. Returns it contiguous, or
/// an undefined tensor.
inline at::Tensor check_init_only(const std::optional<at::Tensor>& only, int64_t n,
                                  const at::Device& device, const char* op) {
  if (!only.has_value() || !only->defined()) return at::Tensor();
  DEMB_CHECK_TYPE(only->scalar_type() == at::kBool, op, ": only must be bool, got ",
                  only->scalar_type());
  DEMB_CHECK_VALUE(only->dim() == 1 && only->numel() == n, op, ": only must be (", n,
                   ",), one per slot, got ", only->sizes());
  check_on_device(*only, device, "only", op);
  return only->contiguous();
}

/// Every argument of grouped_init_rows that the host can check (both kernels): the group, the
/// (table id, slot) pairs, keys, init and ``only``. Returns ``only`` contiguous, or undefined.
inline at::Tensor check_init_rows_args(const at::Tensor& values, const at::Tensor& meta,
                                       const at::Tensor& table_ids, const at::Tensor& slots,
                                       const at::Tensor& keys, const at::Tensor& init,
                                       const std::optional<at::Tensor>& only, const char* op) {
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  const int64_t n = slots.numel();
  check_init_keys(keys, init, n, meta.size(0), values.device(), op);
  return check_init_only(only, n, values.device(), op);
}

/// The bag layout: ``offsets`` (F*B+1,) feature-major, ``feature_tables`` (F,), ``d_offsets``
/// (F+1,), ``inverse`` and the optional ``weights`` (n,), all on one device.
inline void check_group_bags(const at::Tensor& inverse, const at::Tensor& offsets,
                             const std::optional<at::Tensor>& weights,
                             const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                             int64_t mode, int64_t batch_size, const char* op) {
  DEMB_CHECK_VALUE(mode == kPoolSum || mode == kPoolMean ||
                       mode == grouped::kPoolNone,
                   op, ": mode must be 0 (SUM), 1 (MEAN) or 2 (NONE), got ", mode);
  check_bags(inverse, offsets, weights, kPoolSum, op);
  DEMB_CHECK_TYPE(feature_tables.scalar_type() == at::kLong && d_offsets.scalar_type() == at::kLong,
                  op, ": feature_tables and d_offsets must be int64");
  DEMB_CHECK_VALUE(feature_tables.dim() == 1 && d_offsets.dim() == 1 &&
                       d_offsets.numel() == feature_tables.numel() + 1,
                   op, ": feature_tables must be (F,) and d_offsets (F+1,), got ",
                   feature_tables.sizes(), " and ", d_offsets.sizes());
  DEMB_CHECK_VALUE(batch_size >= 0 && offsets.numel() == feature_tables.numel() * batch_size + 1, op,
                   ": offsets must be (F*B+1,) = (", feature_tables.numel() * batch_size + 1,
                   ",) for F=", feature_tables.numel(), " B=", batch_size, ", got ",
                   offsets.sizes());
  check_on_device(feature_tables, inverse.device(), "feature_tables", op);
  check_on_device(d_offsets, inverse.device(), "d_offsets", op);
}

inline void check_segmented_unique(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, const char* op) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong && table_ids.scalar_type() == at::kLong, op,
                  ": keys and table_ids must be int64, got ", keys.scalar_type(), " and ",
                  table_ids.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1 && table_ids.dim() == 1 && keys.numel() == table_ids.numel(),
                   op, ": keys and table_ids must be (n,) of one length, got ", keys.sizes(),
                   " and ", table_ids.sizes());
  DEMB_CHECK_VALUE(num_tables >= 1, op, ": num_tables must be >= 1, got ", num_tables);
  check_on_device(table_ids, keys.device(), "table_ids", op);
}

/// The table id op: offsets (F*B+1,) int64 feature-major, feature_tables (F,) int64, on one device.
inline void check_bag_table_ids(const at::Tensor& offsets, const at::Tensor& feature_tables,
                                int64_t batch_size, int64_t n, const char* op) {
  DEMB_CHECK_TYPE(offsets.scalar_type() == at::kLong && feature_tables.scalar_type() == at::kLong,
                  op, ": offsets and feature_tables must be int64, got ", offsets.scalar_type(),
                  " and ", feature_tables.scalar_type());
  DEMB_CHECK_VALUE(offsets.dim() == 1 && feature_tables.dim() == 1, op,
                   ": offsets and feature_tables must be 1-D, got ", offsets.sizes(), " and ",
                   feature_tables.sizes());
  DEMB_CHECK_VALUE(batch_size >= 0 && n >= 0, op, ": batch_size and n must be >= 0, got ",
                   batch_size, " and ", n);
  DEMB_CHECK_VALUE(offsets.numel() == feature_tables.numel() * batch_size + 1, op,
                   ": offsets must have F*B+1 = ", feature_tables.numel() * batch_size + 1,
                   " elements (F=", feature_tables.numel(), ", B=", batch_size, "), got ",
                   offsets.numel());
  check_on_device(feature_tables, offsets.device(), "feature_tables", op);
}

/// bag_unique's inputs: keys (n,) int64 on the offsets' device, the batch as check_bag_table_ids
/// wants it, num_tables >= 1, and a bag for every index (n == 0 when F or B is 0).
inline void check_bag_unique(const at::Tensor& keys, const at::Tensor& offsets,
                             const at::Tensor& feature_tables, int64_t batch_size,
                             int64_t num_tables, const char* op) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong, op, ": keys must be int64, got ",
                  keys.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1, op, ": keys must be 1-D, got ", keys.sizes());
  check_on_device(offsets, keys.device(), "offsets", op);
  check_bag_table_ids(offsets, feature_tables, batch_size, keys.numel(), op);
  DEMB_CHECK_VALUE(num_tables >= 1, op, ": num_tables must be >= 1, got ", num_tables);
  DEMB_CHECK_VALUE(keys.numel() == 0 || (feature_tables.numel() > 0 && batch_size > 0), op, ": ",
                   keys.numel(), " indices but no bag (F=", feature_tables.numel(),
                   ", B=", batch_size, ")");
}

/// The placement counts op: table_ids, slots (u,) int64, is_new (u,) bool and sizes (T,) int64 on
/// one device.
inline void check_placement_counts(const at::Tensor& table_ids, const at::Tensor& slots,
                                   const at::Tensor& is_new, const at::Tensor& sizes,
                                   const char* op) {
  check_row_ids(table_ids, slots, table_ids.device(), op);
  DEMB_CHECK_TYPE(is_new.scalar_type() == at::kBool && is_new.dim() == 1 &&
                      is_new.numel() == slots.numel(),
                  op, ": is_new must be (", slots.numel(), ",) bool, got ", is_new.sizes(), " ",
                  is_new.scalar_type());
  DEMB_CHECK_TYPE(sizes.scalar_type() == at::kLong, op, ": sizes must be int64, got ",
                  sizes.scalar_type());
  DEMB_CHECK_VALUE(sizes.dim() == 1 && sizes.numel() >= 1, op,
                   ": sizes must be (T,) with T >= 1, got ", sizes.sizes());
  check_on_device(is_new, table_ids.device(), "is_new", op);
  check_on_device(sizes, table_ids.device(), "sizes", op);
}

/// The reduction's optional key order (segmented_unique's ``order`` and ``counts``): key_counts
/// (u,) alone (the CPU reduction's layout needs only the counts), both, or neither; order (n,);
/// int64 on the inverse's device.
inline void check_key_order(const std::optional<at::Tensor>& order,
                            const std::optional<at::Tensor>& key_counts, int64_t n, int64_t u,
                            const at::Device& device, const char* op) {
  DEMB_CHECK_VALUE(!order.has_value() || key_counts.has_value(), op,
                   ": order comes with key_counts (segmented_unique_ordered's), got order alone");
  if (!key_counts.has_value()) return;
  DEMB_CHECK_TYPE(key_counts->scalar_type() == at::kLong, op, ": key_counts must be int64, got ",
                  key_counts->scalar_type());
  DEMB_CHECK_VALUE(key_counts->dim() == 1 && key_counts->numel() == u, op,
                   ": key_counts must be (", u, ",), got ", key_counts->sizes());
  check_on_device(*key_counts, device, "key_counts", op);
  if (!order.has_value()) return;
  DEMB_CHECK_TYPE(order->scalar_type() == at::kLong, op, ": order must be int64, got ",
                  order->scalar_type());
  DEMB_CHECK_VALUE(order->dim() == 1 && order->numel() == n, op, ": order must be (", n,
                   ",), got ", order->sizes());
  check_on_device(*order, device, "order", op);
}

/// grouped_gather's optional ``inverse``: (m,) int64 on ``device`` (its values index the pairs).
inline void check_gather_inverse(const std::optional<at::Tensor>& inverse,
                                 const at::Device& device, const char* op) {
  if (!inverse.has_value()) return;
  DEMB_CHECK_TYPE(inverse->scalar_type() == at::kLong && inverse->dim() == 1, op,
                  ": inverse must be (m,) int64, got ", inverse->sizes(), " ",
                  inverse->scalar_type());
  check_on_device(*inverse, device, "inverse", op);
}

}  // namespace dynamicemb
