/**
 * @file bucket_layout.h
 * @brief Where a table's buckets and slots live in the flat state arrays (docs/table_design.md).
 *
 * Table t owns global slots [slot_offsets[t], slot_offsets[t+1]), cut into buckets of
 * bucket_caps[t] slots. Slots handed to callers are local: global - slot_offsets[t].
 */
#pragma once

#include <cstdint>

#include "dynamicemb/host_device.h"

namespace dynamicemb {

/** @brief The layout of one logical table, read from slot_offsets / bucket_caps. */
struct TableLayout {
  int64_t offset;       ///< first global slot of the table
  int64_t capacity;     ///< slots of the table (num_buckets * bucket_cap)
  int64_t bucket_cap;   ///< slots per bucket
  int64_t num_buckets;  ///< capacity / bucket_cap
};

/** @brief Layout of table t from the (T+1,) offsets and (T,) bucket capacities. */
DEMB_HOST_DEVICE TableLayout table_layout(const int64_t* slot_offsets, const int64_t* bucket_caps,
                                          int64_t t) {
  TableLayout l;
  l.offset = slot_offsets[t];
  l.capacity = slot_offsets[t + 1] - slot_offsets[t];
  l.bucket_cap = bucket_caps[t];
  l.num_buckets = l.bucket_cap > 0 ? l.capacity / l.bucket_cap : 0;
  return l;
}

/** @brief First global slot of bucket b of a table. */
DEMB_HOST_DEVICE int64_t bucket_begin(const TableLayout& l, int64_t bucket) {
  return l.offset + bucket * l.bucket_cap;
}

/** @brief Bucket that a local slot belongs to. */
DEMB_HOST_DEVICE int64_t bucket_of_local_slot(const TableLayout& l, int64_t local_slot) {
  return local_slot / l.bucket_cap;
}

}  // namespace dynamicemb
