/**
 * @file table_upsert.cuh
 * @brief The bucket-grouped engine behind every op that writes keys: insert, find_or_insert,
 * insert_and_evict, erase and insert_at. Params struct, kernels, launcher, selector (STYLE rule 7).
 *
 * Why grouped: the contract's outcome (docs/table_design.md, "Semantics shared by every inserting
 * op") depends on the order in which a bucket's new keys take its empty slots and victims. The
 * contract runs two passes per bucket: (A) present keys keep their slots, are touched and
 * protected; (B) new keys, in input order, take the lowest empty slot, else the unprotected slot
 * of lowest rank. Pass A does not depend on the order: every probe of it sees the bucket as the
 * call found it (pass A writes no key), and its touches commute (touch_atomic, as find's). So it
 * runs key-parallel first, a tile of 4 threads per key (prepare_kernel), which also gives each key
 * its sort key: its bucket's first global slot while the key still needs its bucket's owner, else
 * a sentinel. A stable radix sort then groups the owners' keys by bucket in input order, and one
 * owner per bucket runs what depends on the order: pass B over its new keys, the input words of
 * its present keys (with input_scores the last occurrence wins), erase's frees, insert_at. One
 * owner per bucket means no locks, and the result is deterministic and slot-for-slot equal to the
 * CPU kernels (so DEMB_DETERMINISM_MODE needs nothing extra on CUDA). The owner is a tile of 4
 * threads (8 buckets per warp, for memory-level parallelism: the work is a chain of dependent
 * loads), which probes 128 digests per step with two 16-byte loads per thread; its rank-0 thread
 * does the few scalar writes. The first keys of a run are loaded once, in parallel, and handed to
 * the passes by shuffles.
 */
#pragma once

#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include "table_common.cuh"
#include "table_find.cuh"

namespace dynamicemb {
namespace cuda_table {

/** @brief What one engine call does with its keys. */
enum class UpsertMode : int {
  kInsert = 0,          ///< insert-or-assign; victims discarded
  kFindOrInsert = 1,    ///< like kInsert, is_new reported
  kInsertAndEvict = 2,  ///< like kInsert, victims reported
  kErase = 3,           ///< free the keys' slots
  kInsertAt = 4,        ///< slot-exact placement (replay)
};

constexpr int64_t kPending = -2;       // pass A: "not present, pass B decides"
constexpr int kSharedSizeTables = 16;  // tables whose size deltas a block sums in shared memory

struct UpsertParams {
  UpsertMode mode;
  const int64_t* keys;
  const int64_t* table_ids;
  int64_t n;
  int64_t* table_keys;
  uint8_t* digests;
  int64_t* scores;  // (total_slots, 2)
  const int64_t* slot_offsets;
  const int64_t* bucket_caps;
  const int64_t* policies;
  int64_t* sizes;
  int64_t num_tables;
  const int64_t* now;           // (T,) resolved score of the call; null for erase / insert_at
  const int64_t* input_scores;  // (n, 2) internal order, or null
  const int64_t* counts;        // (n,) accesses each key's touch counts (touch_count), or null
  const int64_t* in_slots;      // kInsertAt: (n,) local slots
  bool dry_run;                 // kInsertAt: check only
  const double* fn_scores;      // (total_slots,) score-function ranks, or null
  const uint8_t* has_fn;        // (T,) 1 where fn_scores ranks the table, or null
  uint32_t* protect_bits;       // (ceil(total_slots / 32),) zeroed: slots written by this call
  const int32_t* pins;          // (total_slots,) pin counts, or null: a pinned slot is no victim
  int32_t* dedup;               // key-parallel engine: (table, key) -> first index map, -1 filled
  int64_t dedup_mask;           // its words - 1 (a power of two >= 2n)
  bool unique_keys;             // the caller promises distinct (table, key): no map (n/a: 0 words)
  int64_t* pending;             // key-parallel engine: (n, 2) leaders left for the evict pass
  int32_t* pending_count;       // how many (zeroed; the word after the protect bits' padding)
  int64_t* out_slots;           // (n,) local slot or -1
  bool* out_flag;               // (n,) is_new / erased / placed
  // kInsertAndEvict's report, indexed by key (deterministic engine) or by pending-list entry
  // (key-parallel engine, which writes every entry's flag; the deterministic one needs it zeroed)
  bool* ev_flag;                // (n,) entry's key evicted someone
  int64_t* ev_keys;             // (n,)
  int64_t* ev_slots;            // (n,) local
  int64_t* ev_scores;           // (n, 2) internal order
  int64_t* ev_table_ids;        // key-parallel engine: (n,) table of each report entry
  int32_t* evicted_count;       // key-parallel engine: victims taken (zeroed; after pending_count)
  // key-parallel engine: pass 1 lists the leaders it placed in empty slots (global slot | digest
  // << 56; pass 2 writes their digests) and the followers (pass 3 runs over them only)
  uint64_t* placed;             // (n,)
  int32_t* placed_count;        // zeroed, after evicted_count
  int32_t* followers;           // (n,) key indices
  int32_t* follower_count;      // zeroed, after placed_count
};

namespace cg = cooperative_groups;
constexpr int kUpsertTile = 4;  // threads per bucket owner
constexpr int kUpsertVec = 2;   // 16-byte digest loads per thread: 4 x 2 x 16 = 128 slots per step
using UpsertTile = cg::thread_block_tile<kUpsertTile>;

/** @brief A victim candidate: global slot (-1: none), its words and its score-function rank. */
struct Candidate {
  int64_t g;
  int64_t w0, w1;
  double f;
};

/** @brief True when `a` is evicted before `b`: lower rank, then lower slot; no candidate is last. */
__device__ __forceinline__ bool evicts_before(const Candidate& a, const Candidate& b,
                                              int64_t policy, bool use_fn) {
  if (a.g < 0) return false;
  if (b.g < 0) return true;
  if (use_fn) {
    if (fn_ranks_below(a.f, b.f)) return true;
    if (fn_ranks_below(b.f, a.f)) return false;
  } else {
    const int64_t wa[2] = {a.w0, a.w1}, wb[2] = {b.w0, b.w1};
    if (ranks_below(policy, wa, wb)) return true;
    if (ranks_below(policy, wb, wa)) return false;
  }
  return a.g < b.g;
}

/**
 * @brief The unprotected occupied slot of [begin, end) that the contract evicts first, or -1;
 * each thread scans a strided share of the bucket, then the tile reduces. All threads get it.
 */
__device__ __forceinline__ int64_t tile_victim(const UpsertTile& tile, const UpsertParams& p,
                                               const KeyHome& home, int64_t policy, bool use_fn) {
  Candidate best{-1, 0, 0, 0.0};
  for (int64_t g = home.begin + tile.thread_rank(); g < home.end; g += kUpsertTile) {
    if (p.digests[g] == 0 || is_protected(p.protect_bits, g)) continue;
    if (p.pins != nullptr && p.pins[g] > 0) continue;
    Candidate c{g, 0, 0, use_fn ? p.fn_scores[g] : 0.0};
    if (!use_fn) {
      int64_t w[2];
      load_words(p.scores, g, w);
      c.w0 = w[0];
      c.w1 = w[1];
    }
    if (evicts_before(c, best, policy, use_fn)) best = c;
  }
  for (int o = kUpsertTile / 2; o > 0; o >>= 1) {
    Candidate other;
    other.g = tile.shfl_xor(best.g, o);
    other.w0 = tile.shfl_xor(best.w0, o);
    other.w1 = tile.shfl_xor(best.w1, o);
    other.f = tile.shfl_xor(best.f, o);
    if (evicts_before(other, best, policy, use_fn)) best = other;
  }
  return best.g;
}

/** @brief The words a touch leaves: the caller's input words, else the policy's rule. */
__device__ __forceinline__ void touched_words(const UpsertParams& p, int64_t i, int64_t policy,
                                              int64_t now, int64_t* w) {
  if (p.input_scores != nullptr) {
    w[0] = p.input_scores[2 * i];
    w[1] = p.input_scores[2 * i + 1];
  } else {
    apply_touch(policy, now, w, touch_count(p.counts, i));
  }
}

/** @brief What a bucket's owner knows about its bucket and its table for the whole run. */
struct Segment {
  KeyHome home;  // begin / end / layout shared by every key of the run; digest set per key
  int64_t table;
  int64_t policy;
  int64_t now;
  bool use_fn;
};

/** @brief The run's home with key i's digest (the hash is recomputed: no memory access). */
__device__ __forceinline__ KeyHome home_for(const Segment& seg, int64_t key) {
  KeyHome h = seg.home;
  h.digest = digest_of(hash_key(key));
  return h;
}

/**
 * @brief Pass A, key-parallel, a tile per key, and each key's sort key (its bucket's first global
 * slot, or `sentinel`: sorted last, no owner work). Present keys keep their slot: protected, and
 * touched with atomics (commutative, so the order of a duplicate's occurrences does not matter);
 * with input_scores their words are left to the owner, which writes them in input order. Missing
 * keys are marked kPending for pass B; erase records the global slot for the owner's free;
 * insert_at only gets its sort key. A bad table id or a bucketless table: missing / not placed,
 * nothing written.
 */
template <typename KeyT>
__global__ void __launch_bounds__(kBlockThreads)
    prepare_kernel(UpsertParams p, KeyT sentinel, KeyT* __restrict__ home_out,
                   int32_t* __restrict__ index_out) {
  const UpsertTile tile = cg::tiled_partition<kUpsertTile>(cg::this_thread_block());
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kUpsertTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = p.keys[i];
  const int64_t t = p.table_ids[i];
  KeyHome home;
  if (!key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    if (tile.thread_rank() == 0) {
      home_out[i] = sentinel;
      index_out[i] = static_cast<int32_t>(i);
      p.out_slots[i] = -1;
      p.out_flag[i] = false;
    }
    return;  // the same for the whole tile
  }
  KeyT sort_key = static_cast<KeyT>(home.begin);
  if (p.mode != UpsertMode::kInsertAt) {
    const int64_t g =
        tile_probe<kUpsertVec>(tile, p.table_keys, p.digests, key, home, false).hit;
    if (tile.thread_rank() == 0) {
      if (p.mode == UpsertMode::kErase) {
        p.out_flag[i] = g >= 0;
        p.out_slots[i] = g;  // global, consumed by pass_erase
        if (g < 0) sort_key = sentinel;
      } else if (g >= 0) {
        p.out_slots[i] = g - home.layout.offset;
        p.out_flag[i] = false;
        protect(p.protect_bits, g);
        if (p.input_scores == nullptr) {
          touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g, touch_count(p.counts, i));
          sort_key = sentinel;
        }
      } else {
        p.out_slots[i] = kPending;
      }
    }
  }
  if (tile.thread_rank() == 0) {
    home_out[i] = sort_key;
    index_out[i] = static_cast<int32_t>(i);
  }
}

/**
 * @brief A present key's input words (pass A with input_scores), written by the owner so that of
 * a key's occurrences the last one in input order gives the words, as on CPU.
 */
__device__ __forceinline__ void pass_present_words(const UpsertTile& tile, const UpsertParams& p,
                                                   const Segment& seg, int64_t i) {
  if (tile.thread_rank() == 0) {
    const int64_t w[2] = {p.input_scores[2 * i], p.input_scores[2 * i + 1]};
    store_words(p.scores, seg.home.layout.offset + p.out_slots[i], w);
  }
  tile.sync();
}

/**
 * @brief Pass B for one new key: a duplicate placed earlier in this call, else the lowest empty
 * slot, else a victim. Returns the change in the table's size (rank 0 only).
 */
__device__ __forceinline__ int64_t pass_new(const UpsertTile& tile, const UpsertParams& p,
                                            const Segment& seg, int64_t i, int64_t key) {
  const KeyHome home = home_for(seg, key);
  const Probe probe = tile_probe<kUpsertVec>(tile, p.table_keys, p.digests, key, home, true);
  int64_t g = probe.hit >= 0 ? probe.hit : probe.empty;
  const bool again = probe.hit >= 0;  // an earlier occurrence of this key placed it in this call
  const bool was_empty = !again && g >= 0;
  bool evicting = false;
  if (g < 0 && policy_can_evict(seg.policy)) {
    g = tile_victim(tile, p, home, seg.policy, seg.use_fn);
    evicting = g >= 0;
  }
  int64_t delta = 0;
  if (tile.thread_rank() == 0) {
    p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
    p.out_flag[i] = g >= 0;
    if (g >= 0) {
      int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
      if (again) load_words(p.scores, g, w);
      if (evicting && p.mode == UpsertMode::kInsertAndEvict) {
        int64_t old[2];
        load_words(p.scores, g, old);
        p.ev_flag[i] = true;
        p.ev_keys[i] = p.table_keys[g];
        p.ev_slots[i] = g - home.layout.offset;
        p.ev_scores[2 * i] = old[0];
        p.ev_scores[2 * i + 1] = old[1];
      }
      touched_words(p, i, seg.policy, seg.now, w);
      store_words(p.scores, g, w);
      p.table_keys[g] = key;
      p.digests[g] = home.digest;
      protect(p.protect_bits, g);
      delta = was_empty ? 1 : 0;
    }
  }
  tile.sync();
  return delta;
}

/** @brief erase, after pass A found every occurrence: free each slot once. */
__device__ __forceinline__ int64_t pass_erase(const UpsertTile& tile, const UpsertParams& p,
                                              int64_t i) {
  int64_t delta = 0;
  if (tile.thread_rank() == 0) {
    const int64_t g = p.out_slots[i];
    if (g >= 0 && p.digests[g] != 0) {
      p.digests[g] = 0;
      delta = -1;
    }
  }
  tile.sync();
  return delta;
}

/**
 * @brief insert_at for one key: its slot must lie in its bucket and either hold the key or be
 * empty while the key lives nowhere else in the bucket (as the CPU kernel rules).
 */
__device__ __forceinline__ int64_t pass_insert_at(const UpsertTile& tile, const UpsertParams& p,
                                                  const Segment& seg, int64_t i, int64_t key) {
  const KeyHome home = home_for(seg, key);
  const int64_t at = tile_probe<kUpsertVec>(tile, p.table_keys, p.digests, key, home, false).hit;
  int64_t delta = 0;
  if (tile.thread_rank() == 0) {
    const int64_t local = p.in_slots[i];
    const int64_t g = home.layout.offset + local;
    const bool in_bucket =
        local >= 0 && local < home.layout.capacity && g >= home.begin && g < home.end;
    const bool holds_key = in_bucket && at == g;
    const bool ok = holds_key || (in_bucket && at < 0 && p.digests[g] == 0);
    p.out_flag[i] = ok;
    if (ok && !p.dry_run) {
      const int64_t w[2] = {p.input_scores[2 * i], p.input_scores[2 * i + 1]};
      store_words(p.scores, g, w);
      p.table_keys[g] = key;
      p.digests[g] = home.digest;
      delta = holds_key ? 0 : 1;
    }
  }
  tile.sync();
  return delta;
}

/** @brief One past the run of equal homes that starts at sorted position w (tile-parallel). */
template <typename KeyT>
__device__ __forceinline__ int64_t run_end(const UpsertTile& tile, const KeyT* sorted_home,
                                           int64_t n, int64_t w, KeyT home) {
  int64_t end = w + 1;
  for (;;) {
    const int64_t j = end + tile.thread_rank();
    const unsigned differs = tile.ballot(j >= n || sorted_home[j] != home);
    if (differs) return end + __ffs(differs) - 1;
    end += kUpsertTile;
  }
}

/**
 * @brief One tile per sorted position; the tile at the start of a run of equal homes (one bucket)
 * owns it: the order-dependent work of its keys in input order (pass B, present keys' input
 * words, erase's frees, insert_at), then the size change, summed per block in shared memory for
 * the first tables. Keys that prepare_kernel finished sort last (sentinel) and own nothing.
 */
template <typename KeyT>
__global__ void __launch_bounds__(kBlockThreads)
    upsert_kernel(UpsertParams p, const KeyT* __restrict__ sorted_home,
                  const int32_t* __restrict__ order, KeyT sentinel) {
  __shared__ unsigned long long block_delta[kSharedSizeTables];
  if (threadIdx.x < kSharedSizeTables) block_delta[threadIdx.x] = 0;
  __syncthreads();

  const UpsertTile tile = cg::tiled_partition<kUpsertTile>(cg::this_thread_block());
  const int64_t w =
      (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kUpsertTile;
  const KeyT h = w < p.n ? sorted_home[w] : sentinel;
  const bool head = h != sentinel && (w == 0 || sorted_home[w - 1] != h);
  if (head) {
    const int64_t end = run_end(tile, sorted_home, p.n, w, h);
    Segment seg;
    seg.table = p.table_ids[order[w]];
    seg.home.layout = table_layout(p.slot_offsets, p.bucket_caps, seg.table);
    seg.home.begin = static_cast<int64_t>(h);
    seg.home.end = seg.home.begin + seg.home.layout.bucket_cap;
    seg.policy = p.policies[seg.table];
    seg.now = p.now != nullptr ? p.now[seg.table] : 0;
    seg.use_fn = p.has_fn != nullptr && p.has_fn[seg.table] != 0;
    // Inserting runs hold present keys only with input_scores (else prepare_kernel finished them).
    const bool mixed = p.input_scores != nullptr && p.mode != UpsertMode::kErase &&
                       p.mode != UpsertMode::kInsertAt;
    // The run's first kUpsertTile keys: thread r loads key w + r (and whether it is pending) once;
    // the passes shuffle them.
    const int rank = tile.thread_rank();
    const bool mine_in_run = w + rank < end;
    const int64_t mine = mine_in_run ? order[w + rank] : 0;
    const int64_t my_key = mine_in_run && p.mode != UpsertMode::kErase ? p.keys[mine] : 0;
    const bool my_pending = !mixed || (mine_in_run && p.out_slots[mine] == kPending);
    auto index_of = [&](int64_t j) {
      return j - w < kUpsertTile ? tile.shfl(mine, static_cast<int>(j - w)) : int64_t{order[j]};
    };
    auto key_of = [&](int64_t j, int64_t i) {
      return j - w < kUpsertTile ? tile.shfl(my_key, static_cast<int>(j - w)) : p.keys[i];
    };
    auto pending_of = [&](int64_t j, int64_t i) {
      if (!mixed) return true;
      return j - w < kUpsertTile
                 ? tile.shfl(static_cast<int>(my_pending), static_cast<int>(j - w)) != 0
                 : p.out_slots[i] == kPending;  // not written yet: no pass has reached key i
    };
    int64_t delta = 0;
    if (p.mode == UpsertMode::kInsertAt) {
      for (int64_t j = w; j < end; ++j) {
        const int64_t i = index_of(j);
        delta += pass_insert_at(tile, p, seg, i, key_of(j, i));
      }
    } else if (p.mode == UpsertMode::kErase) {
      for (int64_t j = w; j < end; ++j) delta += pass_erase(tile, p, index_of(j));
    } else {
      // In input order: a present key's words commute with pass B (its slot is protected, so no
      // new key takes, ranks or reads it), so the contract's "all of pass A first" still holds.
      for (int64_t j = w; j < end; ++j) {
        const int64_t i = index_of(j);
        if (pending_of(j, i)) {
          delta += pass_new(tile, p, seg, i, key_of(j, i));
        } else {
          pass_present_words(tile, p, seg, i);
        }
      }
    }
    if (tile.thread_rank() == 0 && delta != 0) {
      if (seg.table < kSharedSizeTables) {
        atomicAdd(&block_delta[seg.table], static_cast<unsigned long long>(delta));
      } else {
        atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + seg.table),
                  static_cast<unsigned long long>(delta));
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kSharedSizeTables && threadIdx.x < p.num_tables &&
      block_delta[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + threadIdx.x),
              block_delta[threadIdx.x]);
  }
}

/**
 * @brief insert_and_evict's report, compacted in input order of the keys that evicted: key i with
 * ev_flag[i] goes to position inclusive_count[i] - 1.
 */
__global__ void __launch_bounds__(kBlockThreads)
    compact_evicted_kernel(const bool* __restrict__ ev_flag,
                           const int64_t* __restrict__ inclusive_count, int64_t n,
                           const int64_t* __restrict__ ev_keys, const int64_t* __restrict__ ev_slots,
                           const int64_t* __restrict__ ev_scores,
                           const int64_t* __restrict__ table_ids, int64_t* __restrict__ out_keys,
                           int64_t* __restrict__ out_slots, int64_t* __restrict__ out_scores,
                           int64_t* __restrict__ out_table_ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (i >= n || !ev_flag[i]) return;
  const int64_t o = inclusive_count[i] - 1;
  out_keys[o] = ev_keys[i];
  out_slots[o] = ev_slots[i];
  out_scores[2 * o] = ev_scores[2 * i];
  out_scores[2 * o + 1] = ev_scores[2 * i + 1];
  out_table_ids[o] = table_ids[i];
}

/** @brief Launcher of the compaction: one read of the count sizes the outputs. */
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> compact_evicted(
    const at::Tensor& ev_flag, const at::Tensor& ev_keys, const at::Tensor& ev_slots,
    const at::Tensor& ev_scores, const at::Tensor& table_ids, cudaStream_t stream) {
  const int64_t n = ev_flag.numel();
  const at::Tensor counts = ev_flag.cumsum(0, at::kLong);
  const int64_t m = n > 0 ? counts[-1].item<int64_t>() : 0;
  const auto opts = ev_keys.options();
  at::Tensor keys = at::empty({m}, opts), slots = at::empty({m}, opts),
             scores = at::empty({m, 2}, opts), tids = at::empty({m}, opts);
  if (m > 0) {
    compact_evicted_kernel<<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream>>>(
        ev_flag.data_ptr<bool>(), counts.data_ptr<int64_t>(), n, ev_keys.data_ptr<int64_t>(),
        ev_slots.data_ptr<int64_t>(), ev_scores.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
        keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), scores.data_ptr<int64_t>(),
        tids.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {keys, slots, scores, tids};
}

/**
 * @brief Everything an inserting call sets up before its first pass, in one kernel: `zero_vecs`
 * 16-byte words zeroed (the protect bits and the counts after them), `map_vecs` filled with all
 * ones (the key-parallel engine's leader map, -1 per int32 word) and the call's score per table
 * resolved (resolve_now_kernel's job, by thread 0). One launch where there were three (a fill, a
 * memset and the clock kernel): on the H200's host those launches, not their GPU time, kept the
 * GPU waiting before the first pass.
 */
__global__ void __launch_bounds__(kBlockThreads)
    upsert_init_kernel(uint4* __restrict__ zero, int64_t zero_vecs, uint4* __restrict__ map,
                       int64_t map_vecs, const int64_t* __restrict__ policies,
                       const int64_t* __restrict__ cur_scores, int64_t num_tables,
                       int64_t* __restrict__ now) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlockThreads;
  if (first == 0) {
    const int64_t clock = global_timer_ns();
    for (int64_t t = 0; t < num_tables; ++t) now[t] = resolve_now(policies[t], cur_scores[t], clock);
  }
  for (int64_t i = first; i < zero_vecs; i += stride) zero[i] = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t i = first; i < map_vecs; i += stride) map[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
}

/** @brief Launcher of upsert_init_kernel: a grid-stride fill, at most 2048 blocks. */
inline void launch_upsert_init(uint4* zero, int64_t zero_vecs, uint4* map, int64_t map_vecs,
                               const int64_t* policies, const int64_t* cur_scores,
                               int64_t num_tables, int64_t* now, cudaStream_t stream) {
  const int64_t blocks =
      std::min<int64_t>(blocks_for(std::max(zero_vecs, map_vecs), kBlockThreads), 2048);
  upsert_init_kernel<<<blocks, kBlockThreads, 0, stream>>>(zero, zero_vecs, map, map_vecs,
                                                           policies, cur_scores, num_tables, now);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Number of bits that hold every value in [0, total_slots] (the sentinel included). */
inline int home_bits(int64_t total_slots) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= total_slots) ++bits;
  return bits;
}

/**
 * @brief Launcher: pass A and the sort keys, a stable radix sort of (sort key, input index), then
 * the bucket owners.
 * Scratch comes from torch's caching allocator on the current stream.
 */
template <typename KeyT>
void launch_upsert(const UpsertParams& p, int64_t total_slots, const at::TensorOptions& dev,
                   cudaStream_t stream) {
  const int bits = home_bits(total_slots);
  const KeyT sentinel = static_cast<KeyT>((uint64_t{1} << bits) - 1);
  const auto key_dtype = sizeof(KeyT) == 4 ? at::kInt : at::kLong;
  at::Tensor homes = at::empty({2, p.n}, dev.dtype(key_dtype));
  at::Tensor index = at::empty({2, p.n}, dev.dtype(at::kInt));
  KeyT* home_in = reinterpret_cast<KeyT*>(homes.data_ptr());
  KeyT* home_out = home_in + p.n;
  int32_t* index_in = index.data_ptr<int32_t>();
  int32_t* index_out = index_in + p.n;

  const int64_t tiles_per_block = kBlockThreads / kUpsertTile;
  prepare_kernel<KeyT><<<blocks_for(p.n, tiles_per_block), kBlockThreads, 0, stream>>>(
      p, sentinel, home_in, index_in);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, home_in, home_out, index_in,
                                                 index_out, static_cast<int>(p.n), 0, bits,
                                                 stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, dev.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, home_in, home_out,
                                                 index_in, index_out, static_cast<int>(p.n), 0,
                                                 bits, stream));

  upsert_kernel<KeyT><<<blocks_for(p.n, tiles_per_block), kBlockThreads, 0, stream>>>(
      p, home_out, index_out, sentinel);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Selector: 32-bit sort keys when the table's slots fit (fewer radix passes), else 64. */
inline void select_upsert(const UpsertParams& p, int64_t total_slots, const at::TensorOptions& dev,
                          cudaStream_t stream) {
  if (p.n == 0) return;
  DEMB_CHECK_VALUE(p.n <= INT32_MAX, "dynamicemb table (CUDA): at most 2^31-1 keys per call, got ",
                    p.n, "; split the call");
  if (total_slots < (int64_t{1} << 31)) {
    launch_upsert<uint32_t>(p, total_slots, dev, stream);
  } else {
    launch_upsert<uint64_t>(p, total_slots, dev, stream);
  }
}

}  // namespace cuda_table
}  // namespace dynamicemb
