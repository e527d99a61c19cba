// segmented_unique, bag_unique and placement_counts on CPU: the dedup of (table id, key) pairs.
// Part of csrc/cpu/grouped.cpp's one translation unit (as csrc/cuda/table.cu's headers): included
// there only, after grouped_common.h.
#pragma once

#include "grouped_common.h"

namespace dynamicemb {
namespace {

using namespace grouped;

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
}  // namespace dynamicemb
