/**
 * @file table_checks.h
 * @brief Argument checks of the table ops, shared by the CPU and CUDA kernels so that both raise
 *        the same error, with the same message, for the same bad input.
 *
 * The shape, dtype and device checks live here whole. The data checks (a table id outside
 * [0, T), a slot outside [-1, capacity)) need the values: each backend finds the first bad index
 * where the data lives, before anything is written, and raises through the functions below.
 */
#pragma once

#include <ATen/ATen.h>

#include "dynamicemb/check.h"

namespace dynamicemb {

/// ``t`` (named ``name``) must be ``dtype``, on the table's ``device`` and ``dim``-D.
inline void check_table_arg(const at::Tensor& t, const char* op, const char* name,
                            at::ScalarType dtype, int64_t dim, const at::Device& device) {
  DEMB_CHECK_TYPE(t.scalar_type() == dtype, "dynamicemb.", op, ": ", name, " must be ", dtype,
                  ", got ", t.scalar_type());
  DEMB_CHECK_VALUE(t.device() == device, "dynamicemb.", op, ": ", name, " must be on ", device,
                   " like the table, got ", t.device());
  DEMB_CHECK_VALUE(t.dim() == dim, "dynamicemb.", op, ": ", name, " must be ", dim,
                   "-D, got shape ", t.sizes());
}

/// A tensor of the table's state: as check_table_arg, and contiguous (kernels index it raw).
inline void check_state_arg(const at::Tensor& t, const char* op, const char* name,
                            at::ScalarType dtype, int64_t dim, const at::Device& device) {
  check_table_arg(t, op, name, dtype, dim, device);
  DEMB_CHECK_VALUE(t.is_contiguous(), "dynamicemb.", op, ": ", name,
                   " must be contiguous (call .contiguous() first)");
}

/// The seven tensors of a table's state on ``device``: dtypes, ranks and matching lengths.
inline void check_state_args(const char* op, const at::Tensor& table_keys,
                             const at::Tensor& digests, const at::Tensor& scores,
                             const at::Tensor& slot_offsets, const at::Tensor& bucket_caps,
                             const at::Tensor& policies, const at::Tensor& sizes,
                             const at::Device& device) {
  check_state_arg(table_keys, op, "table_keys", at::kLong, 1, device);
  check_state_arg(digests, op, "digests", at::kByte, 1, device);
  check_state_arg(scores, op, "scores", at::kLong, 2, device);
  check_state_arg(slot_offsets, op, "slot_offsets", at::kLong, 1, device);
  check_state_arg(bucket_caps, op, "bucket_caps", at::kLong, 1, device);
  check_state_arg(policies, op, "policies", at::kLong, 1, device);
  check_state_arg(sizes, op, "sizes", at::kLong, 1, device);
  const int64_t total = table_keys.size(0);
  const int64_t T = bucket_caps.size(0);
  DEMB_CHECK_VALUE(digests.size(0) == total && scores.size(0) == total && scores.size(1) == 2,
                   "dynamicemb.", op, ": digests must be (", total, ",) and scores (", total,
                   ", 2) like table_keys, got ", digests.sizes(), " and ", scores.sizes());
  DEMB_CHECK_VALUE(slot_offsets.size(0) == T + 1 && policies.size(0) == T && sizes.size(0) == T,
                   "dynamicemb.", op, ": slot_offsets must be (T+1,) and policies, sizes (T,) for T=",
                   T, " tables, got ", slot_offsets.sizes(), ", ", policies.sizes(), ", ",
                   sizes.sizes());
}

/// keys and table_ids: (n,) int64 each, on the table's device.
inline void check_keys_args(const char* op, const at::Tensor& keys, const at::Tensor& table_ids,
                            const at::Device& device) {
  check_table_arg(keys, op, "keys", at::kLong, 1, device);
  check_table_arg(table_ids, op, "table_ids", at::kLong, 1, device);
  DEMB_CHECK_VALUE(keys.size(0) == table_ids.size(0), "dynamicemb.", op,
                   ": keys and table_ids must have the same length, got ", keys.size(0), " and ",
                   table_ids.size(0));
}

/// A per-table argument (cur_scores, score_fns, thresholds): (T,) int64.
inline void check_per_table_arg(const char* op, const at::Tensor& t, const char* name, int64_t T,
                                const at::Device& device) {
  check_table_arg(t, op, name, at::kLong, 1, device);
  DEMB_CHECK_VALUE(t.size(0) == T, "dynamicemb.", op, ": ", name, " must be (", T,
                   ",), one per table, got ", t.sizes());
}

/// input_scores: (n, 2) int64, both score words of each key.
inline void check_input_scores_arg(const char* op, const at::Tensor& s, int64_t n,
                                   const at::Device& device) {
  check_table_arg(s, op, "input_scores", at::kLong, 2, device);
  DEMB_CHECK_VALUE(s.size(0) == n && s.size(1) == 2, "dynamicemb.", op,
                   ": input_scores must be (n, 2) = (", n, ", 2), got ", s.sizes());
}

/// counts (find, insert, find_or_insert, insert_and_evict): an optional contiguous (n,) int64
/// tensor, the accesses each key's touch counts (score_policy.h, touch_count). Returns its data
/// pointer, or null when the op was given none. The values (>= 0) are checked by the CPU kernels;
/// on CUDA only where the caller asks for the data checks (check_counts_values).
inline const int64_t* check_counts_arg(const char* op, const c10::optional<at::Tensor>& counts,
                                       int64_t n, const at::Device& device) {
  if (!counts.has_value()) return nullptr;
  check_table_arg(*counts, op, "counts", at::kLong, 1, device);
  DEMB_CHECK_VALUE(counts->size(0) == n && counts->is_contiguous(), "dynamicemb.", op,
                   ": counts must be a contiguous (n,) = (", n,
                   ",) int64 tensor, one access count per key, got ", counts->sizes());
  return counts->data_ptr<int64_t>();
}

/// pins: (total_slots,) int32 pin counts, one per global slot (a slot with a count > 0 is never a
/// victim). Returns the contiguous data pointer, or null when the op was given none.
inline const int32_t* check_pins_arg(const char* op, const c10::optional<at::Tensor>& pins,
                                     int64_t total_slots, const at::Device& device) {
  if (!pins.has_value()) return nullptr;
  check_table_arg(*pins, op, "pins", at::kInt, 1, device);
  DEMB_CHECK_VALUE(pins->size(0) == total_slots && pins->is_contiguous(), "dynamicemb.", op,
                   ": pins must be a contiguous (", total_slots,
                   ",) int32 tensor, one count per slot, got ", pins->sizes());
  return pins->data_ptr<int32_t>();
}

/// values (capacity, width), contiguous, and slots (n,) int64 on the same device.
inline void check_rows_args(const char* op, const at::Tensor& values, const at::Tensor& slots) {
  DEMB_CHECK_VALUE(values.dim() == 2 && values.is_contiguous(), "dynamicemb.", op,
                   ": values must be a contiguous (capacity, width) tensor, got shape ",
                   values.sizes());
  check_table_arg(slots, op, "slots", at::kLong, 1, values.device());
}

/// rows of scatter_rows: (n, width) of the values' dtype, on their device.
inline void check_scatter_rows_arg(const at::Tensor& values, const at::Tensor& slots,
                                   const at::Tensor& rows) {
  DEMB_CHECK_TYPE(rows.scalar_type() == values.scalar_type(),
                  "dynamicemb.scatter_rows: rows must have the dtype of values (",
                  values.scalar_type(), "), got ", rows.scalar_type());
  DEMB_CHECK_VALUE(rows.device() == values.device() && rows.dim() == 2 &&
                       rows.size(0) == slots.size(0) && rows.size(1) == values.size(1),
                   "dynamicemb.scatter_rows: rows must be (", slots.size(0), ", ", values.size(1),
                   ") on ", values.device(), ", got ", rows.sizes(), " on ", rows.device());
}

/// Raises for table_ids[i] = t outside [0, T).
[[noreturn]] inline void raise_bad_table_id(const char* op, int64_t i, int64_t t, int64_t T) {
  throw c10::IndexError(check_detail::message("dynamicemb.", op, ": table_ids[", i, "] = ", t,
                                              " is not a table id in [0, ", T, ")"),
                        nullptr);
}

/// Raises for slots[i] = s outside [-1, capacity).
[[noreturn]] inline void raise_bad_slot(const char* op, int64_t i, int64_t s, int64_t capacity) {
  throw c10::IndexError(check_detail::message("dynamicemb.", op, ": slots[", i, "] = ", s,
                                              " is outside [-1, ", capacity, ") for values of ",
                                              capacity, " rows"),
                        nullptr);
}

}  // namespace dynamicemb
