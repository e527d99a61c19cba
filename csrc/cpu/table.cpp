// CPU kernels of the scored hash table (docs/table_design.md): find, insert, find_or_insert,
// insert_and_evict, erase, export_if, insert_at, gather_rows, scatter_rows.
//
// Inserting ops give the contract's input-order semantics while running in parallel: first every
// present key is touched (and its slot protected), then absent keys are placed in input order. The
// table's buckets are split into one contiguous range per worker, every worker scans the keys in input
// order and handles only those whose home bucket is in its range. Each bucket therefore sees its
// keys in input order on exactly one thread, and the result is the same for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dynamicemb/bucket_layout.h"
#include "dynamicemb/hashing.h"
#include "dynamicemb/score_policy.h"
#include "dynamicemb/check.h"
#include "dynamicemb/table_checks.h"

namespace dynamicemb {
namespace {

using at::Tensor;

// Keys handled per worker before splitting an op across threads pays off (measured on 2 cores:
// below this the fork/join overhead of at::parallel_for dominates).
constexpr int64_t kGrain = 4096;
// export_if scans slots in chunks of this many, counting first, then writing.
constexpr int64_t kExportChunk = 1 << 16;

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------------------------------------
// Validation: everything a caller can get wrong, checked before any write.
// ------------------------------------------------------------------------------------------------

/** The table state, checked once per call and viewed through raw pointers. */
struct State {
  int64_t* keys;
  uint8_t* digests;
  int64_t* scores;  // (total, 2)
  const int64_t* offsets;
  const int64_t* caps;
  const int64_t* policies;
  int64_t* sizes;
  int64_t num_tables;
  int64_t total_slots;
  std::vector<int64_t> bucket_base;  // (T+1,) first global bucket id of each table

  TableLayout layout(int64_t t) const { return table_layout(offsets, caps, t); }
};

State check_state(const char* op, const Tensor& table_keys, const Tensor& digests,
                  const Tensor& scores, const Tensor& slot_offsets, const Tensor& bucket_caps,
                  const Tensor& policies, const Tensor& sizes) {
  check_state_args(op, table_keys, digests, scores, slot_offsets, bucket_caps, policies, sizes,
                   at::Device(at::kCPU));
  const int64_t total = table_keys.size(0);
  const int64_t T = bucket_caps.size(0);
  State s;
  s.keys = table_keys.data_ptr<int64_t>();
  s.digests = digests.data_ptr<uint8_t>();
  s.scores = scores.data_ptr<int64_t>();
  s.offsets = slot_offsets.data_ptr<int64_t>();
  s.caps = bucket_caps.data_ptr<int64_t>();
  s.policies = policies.data_ptr<int64_t>();
  s.sizes = sizes.data_ptr<int64_t>();
  s.num_tables = T;
  s.total_slots = total;
  DEMB_CHECK_VALUE(s.offsets[0] == 0 && s.offsets[T] == total, "dynamicemb.", op,
                    ": slot_offsets must start at 0 and end at total_slots=", total, ", got ",
                    s.offsets[0], " and ", s.offsets[T]);
  s.bucket_base.assign(T + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    const TableLayout l = s.layout(t);
    DEMB_CHECK_VALUE(l.bucket_cap > 0 && l.capacity > 0 && l.capacity % l.bucket_cap == 0,
                      "dynamicemb.", op, ": table ", t, " must hold a positive whole number of ",
                      "buckets, got capacity ", l.capacity, " with bucket_caps[t]=", l.bucket_cap);
    DEMB_CHECK_VALUE(is_valid_policy(s.policies[t]), "dynamicemb.", op, ": policies[", t,
                      "] must be a policy code in [0, ", kNumPolicies, "), got ", s.policies[t]);
    s.bucket_base[t + 1] = s.bucket_base[t] + l.num_buckets;
  }
  return s;
}

void check_keys(const char* op, const Tensor& keys, const Tensor& table_ids, int64_t T) {
  check_keys_args(op, keys, table_ids, at::Device(at::kCPU));
  const Tensor tc = table_ids.contiguous();
  const int64_t* tid = tc.data_ptr<int64_t>();
  for (int64_t i = 0; i < tc.numel(); ++i) {
    if (tid[i] < 0 || tid[i] >= T) raise_bad_table_id(op, i, tid[i], T);
  }
}

/** Per-table time of this call: cur_scores[t], or the clock for time policies when it is < 0. */
std::vector<int64_t> resolve_now_all(const State& s, const Tensor& cur_scores) {
  const int64_t* cur = cur_scores.data_ptr<int64_t>();
  const int64_t clock = clock_ns();
  std::vector<int64_t> now(s.num_tables);
  for (int64_t t = 0; t < s.num_tables; ++t) now[t] = resolve_now(s.policies[t], cur[t], clock);
  return now;
}

// ------------------------------------------------------------------------------------------------
// Probing
// ------------------------------------------------------------------------------------------------

/** A key's home: table, bucket (global id), digest. */
struct Home {
  int64_t table;
  int64_t begin;  // first global slot of the home bucket
  int64_t global_bucket;
  uint8_t digest;
};

Home home_of(const State& s, int64_t key, int64_t t) {
  const TableLayout l = s.layout(t);
  const uint64_t h = hash_key(key);
  const int64_t b = bucket_of(h, l.num_buckets);
  return Home{t, bucket_begin(l, b), s.bucket_base[t] + b, digest_of(h)};
}

/**
 * Global slot holding key in its home bucket, or -1; also the bucket's first empty slot.
 *
 * Digests are compared 16 at a time with SSE2 (one compare for the digest, one for empty slots),
 * so a miss in a 128-slot bucket costs 8 vector compares instead of 128 byte compares; keys are
 * read only on a digest match. Buckets need not start 16-aligned (single-bucket tables of any
 * width), hence unaligned loads and a scalar tail.
 */
int64_t probe(const State& s, const Home& home, int64_t key, int64_t* first_empty) {
  const int64_t end = home.begin + s.caps[home.table];
  int64_t empty = -1;
  int64_t g = home.begin;
#if defined(__SSE2__)
  const __m128i want = _mm_set1_epi8(static_cast<char>(home.digest));
  const __m128i zero = _mm_setzero_si128();
  for (; g + 16 <= end; g += 16) {
    const __m128i group = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.digests + g));
    uint32_t match = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(group, want)));
    while (match != 0) {
      const int bit = __builtin_ctz(match);
      if (s.keys[g + bit] == key) {
        if (first_empty) {
          // The first empty slot may lie in this very group, before the match.
          if (empty < 0) {
            const uint32_t e = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(group, zero)));
            if (e != 0) empty = g + __builtin_ctz(e);
          }
          *first_empty = empty;
        }
        return g + bit;
      }
      match &= match - 1;
    }
    if (empty < 0) {
      const uint32_t e = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(group, zero)));
      if (e != 0) empty = g + __builtin_ctz(e);
    }
  }
#endif
  for (; g < end; ++g) {
    const uint8_t d = s.digests[g];
    if (d == home.digest && s.keys[g] == key) {
      if (first_empty) *first_empty = empty;
      return g;
    }
    if (d == 0 && empty < 0) empty = g;
  }
  if (first_empty) *first_empty = empty;
  return -1;
}

/**
 * Call fn(i, home) for keys [b, e) in blocks: hash a block and prefetch each home bucket's digest
 * lines first, then visit it. A lookup is a chain of cache misses (digests, then the key); issuing a
 * block's first misses together overlaps them instead of paying them one after another.
 */
template <typename Fn>
void for_each_home(const State& s, const int64_t* k, const int64_t* tid, int64_t b, int64_t e,
                   Fn&& fn) {
  constexpr int64_t kBlock = 32;
  Home homes[kBlock];
  for (int64_t start = b; start < e; start += kBlock) {
    const int64_t stop = std::min(e, start + kBlock);
    for (int64_t i = start; i < stop; ++i) {
      homes[i - start] = home_of(s, k[i], tid[i]);
      __builtin_prefetch(s.digests + homes[i - start].begin);
      __builtin_prefetch(s.digests + homes[i - start].begin + 64);
    }
    for (int64_t i = start; i < stop; ++i) fn(i, homes[i - start]);
  }
}

// ------------------------------------------------------------------------------------------------
// Inserting ops
// ------------------------------------------------------------------------------------------------

/** Slots written by the current call within one worker's slot range: 1 touched, 2 newly placed. */
class WrittenSlots {
 public:
  WrittenSlots(int64_t lo, int64_t hi, int64_t expected_writes) : lo_(lo) {
    // Dense marks cost a memset of the range; a hash map wins when the call is small.
    dense_ = (hi - lo) <= 64 * std::max<int64_t>(expected_writes, 1024);
    if (dense_) marks_.assign(static_cast<size_t>(hi - lo), 0);
  }
  uint8_t get(int64_t g) const {
    if (dense_) return marks_[g - lo_];
    auto it = sparse_.find(g);
    return it == sparse_.end() ? 0 : it->second;
  }
  void set(int64_t g, uint8_t v) {
    if (dense_) {
      marks_[g - lo_] = v;
    } else {
      sparse_[g] = v;
    }
  }

 private:
  int64_t lo_;
  bool dense_;
  std::vector<uint8_t> marks_;
  std::unordered_map<int64_t, uint8_t> sparse_;
};

/** What an inserting op returns beyond slots; pointers left null are not wanted. */
struct InsertOutputs {
  int64_t* slots;
  bool* is_new;
  // insert_and_evict: per input key, the key it evicted (ev_flag[i] = 1) and that key's words.
  uint8_t* ev_flag = nullptr;
  int64_t* ev_key = nullptr;
  int64_t* ev_words = nullptr;  // (n, 2)
  const int32_t* pins = nullptr;  // (total_slots,) pin counts, or null: pinned slots are no victims
  const int64_t* counts = nullptr;  // (n,) accesses each key's touch counts, or null: 1 each
};

/** Lowest-ranked slot of a full bucket that this call has not written and nobody pinned, or -1. */
int64_t pick_victim(const State& s, const Home& home, const WrittenSlots& written, ScoreFn fn,
                    int64_t now, const int32_t* pins) {
  const int64_t cap = s.caps[home.table];
  const int64_t policy = s.policies[home.table];
  int64_t best = -1;
  double best_fn = 0.0;
  for (int64_t g = home.begin; g < home.begin + cap; ++g) {
    if (written.get(g) != 0 || (pins != nullptr && pins[g] > 0)) continue;
    const int64_t* w = s.scores + 2 * g;
    if (fn != nullptr) {
      const double v = fn(w, now);
      if (best < 0 || fn_ranks_below(v, best_fn)) {
        best = g;
        best_fn = v;
      }
    } else if (best < 0 || ranks_below(policy, w, s.scores + 2 * best)) {
      best = g;
    }
  }
  return best;
}

/** Write the call's score into slot g: input_scores[i] when given, else the policy's touch
 * (counting counts[i] accesses, touch_count). */
void write_score(State& s, int64_t g, int64_t i, int64_t t, const int64_t* now,
                 const int64_t* input_scores, const int64_t* counts) {
  int64_t* w = s.scores + 2 * g;
  if (input_scores != nullptr) {
    w[0] = input_scores[2 * i];
    w[1] = input_scores[2 * i + 1];
  } else {
    apply_touch(s.policies[t], now[t], w, touch_count(counts, i));
  }
}

/**
 * Phase 1 for key i: if it is already in its bucket, touch it and protect its slot (rule 2: a
 * present key keeps its slot, even when a new key of the same call comes earlier). Returns false
 * when the key is absent and waits for phase 2.
 */
bool touch_present(State& s, int64_t i, int64_t key, const Home& home, const int64_t* now,
                   const int64_t* input_scores, WrittenSlots& written, InsertOutputs& out) {
  const int64_t g = probe(s, home, key, nullptr);
  if (g < 0) return false;
  write_score(s, g, i, home.table, now, input_scores, out.counts);
  written.set(g, 1);
  out.slots[i] = g - s.offsets[home.table];
  if (out.is_new) out.is_new[i] = false;
  return true;
}

/**
 * Phase 2 for an absent key i: first empty slot of its bucket, else the lowest-ranked slot this
 * call has not written (unless NO_EVICTION), else slot -1. A later duplicate finds the placed key.
 */
void place_absent(State& s, int64_t i, int64_t key, const Home& home, const int64_t* now,
                  const int64_t* score_fns, const int64_t* input_scores, WrittenSlots& written,
                  int64_t* size_delta, InsertOutputs& out) {
  const int64_t t = home.table;
  const int64_t policy = s.policies[t];
  int64_t empty = -1;
  int64_t g = probe(s, home, key, &empty);
  if (g < 0) {
    if (empty >= 0) {
      g = empty;
      size_delta[t] += 1;
    } else if (policy_can_evict(policy)) {
      const ScoreFn fn = score_fns ? reinterpret_cast<ScoreFn>(score_fns[t]) : nullptr;
      g = pick_victim(s, home, written, fn, now[t], out.pins);
      if (g >= 0 && out.ev_flag != nullptr) {
        out.ev_flag[i] = 1;
        out.ev_key[i] = s.keys[g];
        out.ev_words[2 * i] = s.scores[2 * g];
        out.ev_words[2 * i + 1] = s.scores[2 * g + 1];
      }
    }
    if (g < 0) {
      out.slots[i] = -1;
      if (out.is_new) out.is_new[i] = false;
      return;
    }
    s.keys[g] = key;
    s.digests[g] = home.digest;
    s.scores[2 * g] = 0;
    s.scores[2 * g + 1] = 0;
    written.set(g, 2);
  }
  write_score(s, g, i, t, now, input_scores, out.counts);
  out.slots[i] = g - s.offsets[t];
  if (out.is_new) out.is_new[i] = true;  // placed by this call (possibly by an earlier duplicate)
}

/** Prefetch the digests of the key kAhead positions on (the loops below are latency-bound). */
inline void prefetch_ahead(const State& s, const std::vector<Home>& homes, int64_t i, int64_t n) {
  constexpr int64_t kAhead = 16;
  if (i + kAhead < n) {
    __builtin_prefetch(s.digests + homes[i + kAhead].begin);
    __builtin_prefetch(s.digests + homes[i + kAhead].begin + 64);
  }
}

/**
 * Run both phases over all keys: workers own contiguous ranges of global buckets and each scans
 * the keys in input order, so a bucket's keys are handled in input order whatever the thread count.
 */
void insert_all(State& s, const Tensor& keys, const Tensor& table_ids, const int64_t* now,
                const int64_t* score_fns, const int64_t* input_scores, InsertOutputs& out) {
  const int64_t n = keys.numel();
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* tid = table_ids.data_ptr<int64_t>();
  std::vector<Home> homes(n);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) homes[i] = home_of(s, k[i], tid[i]);
  });
  const int64_t total_buckets = s.bucket_base[s.num_tables];
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / kGrain));
  std::vector<std::vector<int64_t>> deltas(workers, std::vector<int64_t>(s.num_tables, 0));
  std::vector<uint8_t> present(n, 0);
  // Global slot where a global bucket id starts (bucket ids are contiguous in slot order).
  auto bucket_slot = [&](int64_t gb) -> int64_t {
    if (gb >= total_buckets) return s.total_slots;
    const int64_t t = std::upper_bound(s.bucket_base.begin(), s.bucket_base.end(), gb) -
                      s.bucket_base.begin() - 1;
    return s.offsets[t] + (gb - s.bucket_base[t]) * s.caps[t];
  };
  at::parallel_for(0, workers, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const int64_t lo = total_buckets * p / workers;
      const int64_t hi = total_buckets * (p + 1) / workers;
      WrittenSlots written(bucket_slot(lo), bucket_slot(hi), n / workers);
      for (int64_t i = 0; i < n; ++i) {
        prefetch_ahead(s, homes, i, n);
        const int64_t gb = homes[i].global_bucket;
        if (gb < lo || gb >= hi) continue;
        present[i] = touch_present(s, i, k[i], homes[i], now, input_scores, written, out);
      }
      for (int64_t i = 0; i < n; ++i) {
        prefetch_ahead(s, homes, i, n);
        const int64_t gb = homes[i].global_bucket;
        if (gb < lo || gb >= hi || present[i]) continue;
        place_absent(s, i, k[i], homes[i], now, score_fns, input_scores, written,
                     deltas[p].data(), out);
      }
    }
  });
  for (const auto& d : deltas) {
    for (int64_t t = 0; t < s.num_tables; ++t) s.sizes[t] += d[t];
  }
}

struct InsertArgs {
  State state;
  Tensor keys, table_ids;
  std::vector<int64_t> now;
  const int64_t* score_fns;
  const int64_t* input_scores;
  Tensor input_scores_c;
};

InsertArgs check_insert(const char* op, const Tensor& keys, const Tensor& table_ids,
                        const Tensor& table_keys, const Tensor& digests, const Tensor& scores,
                        const Tensor& slot_offsets, const Tensor& bucket_caps,
                        const Tensor& policies, const Tensor& score_fns, const Tensor& sizes,
                        const Tensor& cur_scores, const c10::optional<Tensor>& input_scores) {
  InsertArgs a{check_state(op, table_keys, digests, scores, slot_offsets, bucket_caps, policies,
                           sizes)};
  const int64_t T = a.state.num_tables;
  check_keys(op, keys, table_ids, T);
  check_per_table_arg(op, score_fns, "score_fns", T, at::Device(at::kCPU));
  check_per_table_arg(op, cur_scores, "cur_scores", T, at::Device(at::kCPU));
  a.keys = keys.contiguous();
  a.table_ids = table_ids.contiguous();
  a.score_fns = score_fns.contiguous().data_ptr<int64_t>();
  a.input_scores = nullptr;
  if (input_scores.has_value()) {
    check_input_scores_arg(op, *input_scores, keys.size(0), at::Device(at::kCPU));
    a.input_scores_c = input_scores->contiguous();
    a.input_scores = a.input_scores_c.data_ptr<int64_t>();
  }
  a.now = resolve_now_all(a.state, cur_scores.contiguous());
  return a;
}

/** The op's optional per-key access counts (check_counts_arg), each checked >= 0: a touch never
 * lowers an LFU count (0: the key is placed or kept without counting an access, a prefetch). */
const int64_t* check_counts(const char* op, const c10::optional<Tensor>& counts, int64_t n) {
  const int64_t* c = check_counts_arg(op, counts, n, at::Device(at::kCPU));
  for (int64_t i = 0; c != nullptr && i < n; ++i) {
    DEMB_CHECK_VALUE(c[i] >= 0, "dynamicemb.", op, ": counts[", i,
                     "] must be >= 0 (the accesses of key ", i, "), got ", c[i]);
  }
  return c;
}

// ------------------------------------------------------------------------------------------------
// Ops
// ------------------------------------------------------------------------------------------------

/** find's body, named `op` in its errors. */
std::tuple<Tensor, Tensor, Tensor> find_impl(const char* op, const Tensor& keys,
                                             const Tensor& table_ids, const Tensor& table_keys,
                                             const Tensor& digests, const Tensor& scores,
                                             const Tensor& slot_offsets, const Tensor& bucket_caps,
                                             const Tensor& policies, const Tensor& sizes,
                                             const c10::optional<Tensor>& cur_scores,
                                             bool update_score,
                                             const c10::optional<Tensor>& counts = c10::nullopt) {
  State s = check_state(op, table_keys, digests, scores, slot_offsets, bucket_caps, policies,
                        sizes);
  check_keys(op, keys, table_ids, s.num_tables);
  std::vector<int64_t> now;
  if (cur_scores.has_value()) {
    check_per_table_arg(op, *cur_scores, "cur_scores", s.num_tables, at::Device(at::kCPU));
    now = resolve_now_all(s, cur_scores->contiguous());
  }
  const Tensor kc = keys.contiguous(), tc = table_ids.contiguous();
  const int64_t n = kc.numel();
  const int64_t* cnt = check_counts(op, counts, n);
  const int64_t* k = kc.data_ptr<int64_t>();
  const int64_t* tid = tc.data_ptr<int64_t>();
  Tensor slots = at::empty({n}, kc.options());
  Tensor found = at::empty({n}, kc.options().dtype(at::kBool));
  Tensor out_scores = at::zeros({n, 2}, kc.options());
  int64_t* sl = slots.data_ptr<int64_t>();
  bool* fo = found.data_ptr<bool>();
  int64_t* os = out_scores.data_ptr<int64_t>();
  // Pass 1: probe (and touch with atomics, so duplicate keys in one call all count).
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for_each_home(s, k, tid, b, e, [&](int64_t i, const Home& home) {
      const int64_t g = probe(s, home, k[i], nullptr);
      fo[i] = g >= 0;
      sl[i] = g >= 0 ? g - s.offsets[home.table] : -1;
      if (g < 0) return;
      int64_t* w = s.scores + 2 * g;
      if (!update_score) {
        os[2 * i] = w[0];
        os[2 * i + 1] = w[1];
        return;
      }
      const int64_t policy = s.policies[home.table];
      const int64_t t_now = now[home.table];
      if (policy_keeps_words(policy)) return;  // the concurrent form of apply_touch
      if (policy == kLfu || policy == kCompound) {
        __atomic_fetch_add(&w[0], touch_count(cnt, i), __ATOMIC_RELAXED);
        __atomic_store_n(&w[1], policy == kCompound ? t_now : 0, __ATOMIC_RELAXED);
      } else {
        __atomic_store_n(&w[0], t_now, __ATOMIC_RELAXED);
        __atomic_store_n(&w[1], 0, __ATOMIC_RELAXED);
      }
    });
  });
  if (!update_score) return std::make_tuple(slots, found, out_scores);
  // Pass 2: read the words after every touch of this call.
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (sl[i] < 0) continue;
      const int64_t g = sl[i] + s.offsets[tid[i]];
      os[2 * i] = s.scores[2 * g];
      os[2 * i + 1] = s.scores[2 * g + 1];
    }
  });
  return std::make_tuple(slots, found, out_scores);
}

std::tuple<Tensor, Tensor, Tensor> find_cpu(const Tensor& keys, const Tensor& table_ids,
                                            const Tensor& table_keys, const Tensor& digests,
                                            const Tensor& scores, const Tensor& slot_offsets,
                                            const Tensor& bucket_caps, const Tensor& policies,
                                            const Tensor& sizes, const Tensor& cur_scores,
                                            bool update_score, bool /*check: the CPU kernels always check*/,
                                            const c10::optional<Tensor>& counts) {
  return find_impl("find", keys, table_ids, table_keys, digests, scores, slot_offsets, bucket_caps,
                   policies, sizes, cur_scores, update_score, counts);
}

Tensor insert_cpu(const Tensor& keys, const Tensor& table_ids, const Tensor& table_keys,
                  const Tensor& digests, const Tensor& scores, const Tensor& slot_offsets,
                  const Tensor& bucket_caps, const Tensor& policies, const Tensor& score_fns,
                  const Tensor& sizes, const Tensor& cur_scores,
                  const c10::optional<Tensor>& input_scores, bool /*check: the CPU kernels always check*/,
                  const c10::optional<Tensor>& pins, bool /*deterministic: always, on CPU*/,
                  bool /*unique_keys: no leader map on CPU*/,
                  const c10::optional<Tensor>& counts) {
  InsertArgs a = check_insert("insert", keys, table_ids, table_keys, digests, scores, slot_offsets,
                              bucket_caps, policies, score_fns, sizes, cur_scores, input_scores);
  Tensor slots = at::empty({a.keys.numel()}, a.keys.options());
  InsertOutputs out{slots.data_ptr<int64_t>(), nullptr};
  out.pins = check_pins_arg("insert", pins, a.state.total_slots, at::Device(at::kCPU));
  out.counts = check_counts("insert", counts, a.keys.numel());
  insert_all(a.state, a.keys, a.table_ids, a.now.data(), a.score_fns, a.input_scores, out);
  return slots;
}

std::tuple<Tensor, Tensor> find_or_insert_cpu(const Tensor& keys, const Tensor& table_ids,
                                              const Tensor& table_keys, const Tensor& digests,
                                              const Tensor& scores, const Tensor& slot_offsets,
                                              const Tensor& bucket_caps, const Tensor& policies,
                                              const Tensor& score_fns, const Tensor& sizes,
                                              const Tensor& cur_scores, bool /*check: the CPU kernels always check*/,
                                              const c10::optional<Tensor>& pins,
                                              bool /*deterministic: always, on CPU*/,
                                              bool /*unique_keys: no leader map on CPU*/,
                                              const c10::optional<Tensor>& counts) {
  InsertArgs a =
      check_insert("find_or_insert", keys, table_ids, table_keys, digests, scores, slot_offsets,
                   bucket_caps, policies, score_fns, sizes, cur_scores, c10::nullopt);
  const int64_t n = a.keys.numel();
  Tensor slots = at::empty({n}, a.keys.options());
  Tensor is_new = at::empty({n}, a.keys.options().dtype(at::kBool));
  InsertOutputs out{slots.data_ptr<int64_t>(), is_new.data_ptr<bool>()};
  out.pins = check_pins_arg("find_or_insert", pins, a.state.total_slots, at::Device(at::kCPU));
  out.counts = check_counts("find_or_insert", counts, n);
  insert_all(a.state, a.keys, a.table_ids, a.now.data(), a.score_fns, nullptr, out);
  return std::make_tuple(slots, is_new);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> insert_and_evict_cpu(
    const Tensor& keys, const Tensor& table_ids, const Tensor& table_keys, const Tensor& digests,
    const Tensor& scores, const Tensor& slot_offsets, const Tensor& bucket_caps,
    const Tensor& policies, const Tensor& score_fns, const Tensor& sizes, const Tensor& cur_scores,
    const c10::optional<Tensor>& input_scores, bool /*check: the CPU kernels always check*/,
    const c10::optional<Tensor>& pins, bool /*deterministic: always, on CPU*/,
    bool /*unique_keys: no leader map on CPU*/, const c10::optional<Tensor>& counts) {
  InsertArgs a = check_insert("insert_and_evict", keys, table_ids, table_keys, digests, scores,
                              slot_offsets, bucket_caps, policies, score_fns, sizes, cur_scores,
                              input_scores);
  const int64_t n = a.keys.numel();
  const auto opts = a.keys.options();
  Tensor slots = at::empty({n}, opts);
  Tensor is_new = at::empty({n}, opts.dtype(at::kBool));
  std::vector<uint8_t> ev_flag(n, 0);
  std::vector<int64_t> ev_key(n), ev_words(2 * n);
  InsertOutputs out{slots.data_ptr<int64_t>(), is_new.data_ptr<bool>(), ev_flag.data(),
                    ev_key.data(), ev_words.data()};
  out.pins = check_pins_arg("insert_and_evict", pins, a.state.total_slots, at::Device(at::kCPU));
  out.counts = check_counts("insert_and_evict", counts, n);
  insert_all(a.state, a.keys, a.table_ids, a.now.data(), a.score_fns, a.input_scores, out);
  // Compact the evictions in input order (the new key's slot is the one the evicted key had).
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) m += ev_flag[i];
  Tensor ek = at::empty({m}, opts), es = at::empty({m}, opts), ew = at::empty({m, 2}, opts),
         et = at::empty({m}, opts);
  int64_t* ekp = ek.data_ptr<int64_t>();
  int64_t* esp = es.data_ptr<int64_t>();
  int64_t* ewp = ew.data_ptr<int64_t>();
  int64_t* etp = et.data_ptr<int64_t>();
  const int64_t* sl = out.slots;
  const int64_t* tid = a.table_ids.data_ptr<int64_t>();
  for (int64_t i = 0, j = 0; i < n; ++i) {
    if (!ev_flag[i]) continue;
    ekp[j] = ev_key[i];
    esp[j] = sl[i];
    ewp[2 * j] = ev_words[2 * i];
    ewp[2 * j + 1] = ev_words[2 * i + 1];
    etp[j] = tid[i];
    ++j;
  }
  return std::make_tuple(slots, is_new, ek, es, ew, et);
}

Tensor erase_cpu(const Tensor& keys, const Tensor& table_ids, const Tensor& table_keys,
                 const Tensor& digests, const Tensor& scores, const Tensor& slot_offsets,
                 const Tensor& bucket_caps, const Tensor& policies, const Tensor& sizes, bool /*check: the CPU kernels always check*/) {
  State s = check_state("erase", table_keys, digests, scores, slot_offsets, bucket_caps, policies,
                        sizes);
  check_keys("erase", keys, table_ids, s.num_tables);
  const Tensor kc = keys.contiguous(), tc = table_ids.contiguous();
  const int64_t n = kc.numel();
  const int64_t* k = kc.data_ptr<int64_t>();
  const int64_t* tid = tc.data_ptr<int64_t>();
  std::vector<int64_t> where(n);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for_each_home(s, k, tid, b, e,
                  [&](int64_t i, const Home& home) { where[i] = probe(s, home, k[i], nullptr); });
  });
  Tensor erased = at::empty({n}, kc.options().dtype(at::kBool));
  bool* er = erased.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {  // serial: duplicates must free a slot once
    er[i] = where[i] >= 0;
    if (er[i] && s.digests[where[i]] != 0) {
      s.digests[where[i]] = 0;
      s.sizes[tid[i]] -= 1;
    }
  }
  return erased;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> export_if_cpu(
    const Tensor& table_keys, const Tensor& digests, const Tensor& scores,
    const Tensor& slot_offsets, const Tensor& bucket_caps, const Tensor& policies,
    const Tensor& sizes, const Tensor& thresholds, int64_t column) {
  State s = check_state("export_if", table_keys, digests, scores, slot_offsets, bucket_caps,
                        policies, sizes);
  check_per_table_arg("export_if", thresholds, "thresholds", s.num_tables, at::Device(at::kCPU));
  DEMB_CHECK_VALUE(column == 0 || column == 1,
                    "dynamicemb.export_if: column must be 0 or 1, got ", column);
  const Tensor thc = thresholds.contiguous();
  const int64_t* th = thc.data_ptr<int64_t>();
  struct Chunk {
    int64_t table, begin, end;
  };
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < s.num_tables; ++t) {
    for (int64_t b = s.offsets[t]; b < s.offsets[t + 1]; b += kExportChunk) {
      chunks.push_back({t, b, std::min(b + kExportChunk, s.offsets[t + 1])});
    }
  }
  const int64_t nc = static_cast<int64_t>(chunks.size());
  auto keep = [&](const Chunk& c, int64_t g) {
    return s.digests[g] != 0 && s.scores[2 * g + column] >= th[c.table];
  };
  std::vector<int64_t> start(nc + 1, 0);
  at::parallel_for(0, nc, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t cnt = 0;
      for (int64_t g = chunks[c].begin; g < chunks[c].end; ++g) cnt += keep(chunks[c], g);
      start[c + 1] = cnt;
    }
  });
  for (int64_t c = 0; c < nc; ++c) start[c + 1] += start[c];
  const int64_t m = start[nc];
  const auto opts = table_keys.options();
  Tensor ok = at::empty({m}, opts), osl = at::empty({m}, opts), osc = at::empty({m, 2}, opts),
         ot = at::empty({m}, opts);
  int64_t* okp = ok.data_ptr<int64_t>();
  int64_t* oslp = osl.data_ptr<int64_t>();
  int64_t* oscp = osc.data_ptr<int64_t>();
  int64_t* otp = ot.data_ptr<int64_t>();
  at::parallel_for(0, nc, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t j = start[c];
      const Chunk& ch = chunks[c];
      for (int64_t g = ch.begin; g < ch.end; ++g) {
        if (!keep(ch, g)) continue;
        okp[j] = s.keys[g];
        oslp[j] = g - s.offsets[ch.table];
        oscp[2 * j] = s.scores[2 * g];
        oscp[2 * j + 1] = s.scores[2 * g + 1];
        otp[j] = ch.table;
        ++j;
      }
    }
  });
  return std::make_tuple(ok, osl, osc, ot);
}

Tensor insert_at_cpu(const Tensor& keys, const Tensor& table_ids, const Tensor& slots,
                     const Tensor& table_keys, const Tensor& digests, const Tensor& scores,
                     const Tensor& slot_offsets, const Tensor& bucket_caps,
                     const Tensor& policies, const Tensor& sizes, const Tensor& input_scores,
                     bool dry_run) {
  State s = check_state("insert_at", table_keys, digests, scores, slot_offsets, bucket_caps,
                        policies, sizes);
  check_keys("insert_at", keys, table_ids, s.num_tables);
  check_table_arg(slots, "insert_at", "slots", at::kLong, 1, at::Device(at::kCPU));
  DEMB_CHECK_VALUE(slots.size(0) == keys.size(0), "dynamicemb.insert_at: slots must have ",
                    keys.size(0), " entries like keys, got ", slots.size(0));
  check_input_scores_arg("insert_at", input_scores, keys.size(0), at::Device(at::kCPU));
  const Tensor kc = keys.contiguous(), tc = table_ids.contiguous(), sc = slots.contiguous(),
               isc = input_scores.contiguous();
  const int64_t n = kc.numel();
  const int64_t* k = kc.data_ptr<int64_t>();
  const int64_t* tid = tc.data_ptr<int64_t>();
  const int64_t* sl = sc.data_ptr<int64_t>();
  const int64_t* in = isc.data_ptr<int64_t>();
  Tensor placed = at::empty({n}, kc.options().dtype(at::kBool));
  bool* pl = placed.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {  // serial: replay is not on the training path
    const int64_t t = tid[i];
    const TableLayout l = s.layout(t);
    const Home home = home_of(s, k[i], t);
    pl[i] = false;
    if (sl[i] < 0 || sl[i] >= l.capacity) continue;
    const int64_t g = l.offset + sl[i];
    if (g < home.begin || g >= home.begin + l.bucket_cap) continue;  // outside its home bucket
    const bool holds_key = s.digests[g] == home.digest && s.keys[g] == k[i];
    if (!holds_key) {
      // The slot must be empty, and the key must not already live elsewhere in its bucket.
      if (s.digests[g] != 0 || probe(s, home, k[i], nullptr) >= 0) continue;
    }
    pl[i] = true;
    if (dry_run) continue;
    if (!holds_key) {
      s.keys[g] = k[i];
      s.digests[g] = home.digest;
      s.sizes[t] += 1;
    }
    s.scores[2 * g] = in[2 * i];
    s.scores[2 * g + 1] = in[2 * i + 1];
  }
  return placed;
}

void check_rows_slots(const char* op, const Tensor& values, const Tensor& slots) {
  DEMB_CHECK_VALUE(values.device().is_cpu(), "dynamicemb.", op,
                   ": values must be on cpu like slots, got ", values.device());
  check_rows_args(op, values, slots);
  const Tensor sc = slots.contiguous();
  const int64_t* sl = sc.data_ptr<int64_t>();
  const int64_t cap = values.size(0);
  for (int64_t i = 0; i < sc.numel(); ++i) {
    if (sl[i] < -1 || sl[i] >= cap) raise_bad_slot(op, i, sl[i], cap);
  }
}

/** Rows of `values` at `slots` into `out`; a slot outside [0, capacity) gives a zero row. */
void copy_rows(const Tensor& values, const int64_t* sl, int64_t n, Tensor& out) {
  const int64_t row_bytes = values.size(1) * values.element_size();
  const int64_t cap = values.size(0);
  const char* src = static_cast<const char*>(values.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (sl[i] < 0 || sl[i] >= cap) {
        std::memset(dst + i * row_bytes, 0, row_bytes);
      } else {
        std::memcpy(dst + i * row_bytes, src + sl[i] * row_bytes, row_bytes);
      }
    }
  });
}

Tensor gather_rows_cpu(const Tensor& values, const Tensor& slots, bool /*check: the CPU kernels always check*/) {
  check_rows_slots("gather_rows", values, slots);
  const Tensor sc = slots.contiguous();
  Tensor out = at::empty({sc.numel(), values.size(1)}, values.options());
  copy_rows(values, sc.data_ptr<int64_t>(), sc.numel(), out);
  return out;
}

/** `rows` (n, width, contiguous) into `values` at `sl`; a slot outside [0, capacity) is skipped
 * and a slot named twice keeps the last row given. */
void scatter_rows_into(const Tensor& values, const int64_t* sl, int64_t n, const Tensor& rc) {
  const int64_t cap = values.size(0);
  const int64_t row_bytes = values.size(1) * values.element_size();
  const char* src = static_cast<const char*>(rc.data_ptr());
  char* dst = static_cast<char*>(values.data_ptr());
  // Each worker owns a range of destination rows and scans the input in order, so a slot written
  // twice keeps the last row given, whatever the thread count.
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / kGrain));
  at::parallel_for(0, workers, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const int64_t lo = cap * p / workers, hi = cap * (p + 1) / workers;
      for (int64_t i = 0; i < n; ++i) {
        if (sl[i] >= lo && sl[i] < hi) std::memcpy(dst + sl[i] * row_bytes, src + i * row_bytes, row_bytes);
      }
    }
  });
}

void scatter_rows_cpu(const Tensor& values, const Tensor& slots, const Tensor& rows, bool /*check: the CPU kernels always check*/) {
  check_rows_slots("scatter_rows", values, slots);
  check_scatter_rows_arg(values, slots, rows);
  const Tensor sc = slots.contiguous(), rc = rows.contiguous();
  scatter_rows_into(values, sc.data_ptr<int64_t>(), sc.numel(), rc);
}

/** The clock the CPU kernels read for "cur_scores[t] < 0" (clock_ns), as a 0-d int64 tensor. */
Tensor device_clock_cpu(const Tensor& like) {
  DEMB_CHECK_VALUE(like.device().is_cpu(), "dynamicemb.device_clock: like must be on cpu, got ",
                    like.device());
  return at::scalar_tensor(clock_ns(), like.options().dtype(at::kLong));
}

}  // namespace
}  // namespace dynamicemb

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("find", &dynamicemb::find_cpu);
  m.impl("insert", &dynamicemb::insert_cpu);
  m.impl("find_or_insert", &dynamicemb::find_or_insert_cpu);
  m.impl("insert_and_evict", &dynamicemb::insert_and_evict_cpu);
  m.impl("erase", &dynamicemb::erase_cpu);
  m.impl("export_if", &dynamicemb::export_if_cpu);
  m.impl("insert_at", &dynamicemb::insert_at_cpu);
  m.impl("gather_rows", &dynamicemb::gather_rows_cpu);
  m.impl("scatter_rows", &dynamicemb::scatter_rows_cpu);
  m.impl("device_clock", &dynamicemb::device_clock_cpu);
}
