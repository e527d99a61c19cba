/**
 * @file table_upsert_parallel.cuh
 * @brief The key-parallel engine behind insert, find_or_insert and insert_and_evict on CUDA, run
 * when the ops get deterministic=false (DEMB_DETERMINISM_MODE=0). Kernels, launcher, selector
 * (STYLE rule 7); the params are table_upsert.cuh's UpsertParams.
 *
 * Lock-free: no thread ever waits for another. A slot is claimed by setting its bit in the call's
 * protect bits with one atomicOr; the bit that was clear before wins the slot, a claim that finds
 * it set lost it to another key and scans again. A claimed bit is never cleared during the call, so
 * a slot is handed out at most once per call and never both kept and evicted. Three kernels:
 *
 *  1. present pass (a tile of 4 threads per key, like find): a key already in its bucket keeps its
 *     slot, is touched with atomics and its slot protected. A missing key first registers in a
 *     per-call open-addressing map of (table, key) -> first index (atomicCAS on an int32 word), so
 *     each distinct missing key has exactly one leader; the other occurrences follow it in pass 3.
 *     A leader claims the lowest empty slot of its bucket that no other leader claimed and writes
 *     its key and score words there, but not its digest: a probe of this pass never matches a key
 *     placed in it, so every occurrence of a key sees the same table. A leader that finds no free
 *     empty slot is left pending.
 *  2. evict pass (tiles of 8 threads, one warp reads 32 keys' states and its 4 tiles share the
 *     pending ones): a pending leader of an evicting table takes the victim, the occupied slot of
 *     lowest rank (then lowest slot) that is neither protected nor pinned, found by a reduction
 *     over the tile, claims it, reports it (insert_and_evict) and writes key, words and digest.
 *     Every present key of the call was protected by the end of pass 1, so no key of the call is
 *     a victim.
 *  3. finish pass (a thread per key): leaders placed in empty slots write their digests; followers
 *     take their leader's slot and flag and touch its words (atomics: c occurrences add c counts).
 *
 * What holds whatever the schedule: each (table, key) is present at most once; every returned slot
 * holds its key; present keys keep their slots; each victim is evicted once and reported with the
 * words it had; per bucket, the new keys fill the lowest empty slots (as many as there are new
 * keys), and the victims are the k lowest-ranked unprotected, unpinned slots, k the deterministic
 * engine's (claims are monotone, so a slot that survives unclaimed was a candidate of every victim
 * choice and ranks at or above each victim). What depends on the schedule: which new key lands in
 * which of those slots, and, when a bucket gets more new keys than it can take, which get in.
 */
#pragma once

#include <cooperative_groups.h>

#include "table_common.cuh"
#include "table_find.cuh"
#include "table_upsert.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

constexpr int kPresentTile = 4;  // threads per key in the present pass (as find)
constexpr int kPresentVec = 2;   // 4 x 2 x 16 = 128 digests per step
constexpr int kEvictTile = 8;    // threads per pending key in the evict pass
constexpr int kEvictVec = 1;     // 8 x 16 = 128 slots per step
constexpr int kBlocksPerSm = 8;  // grid of the grid-stride kernels: enough to fill every SM
constexpr int64_t kFollowerBase = -3;  // out_slots of a follower: kFollowerBase - leader index

/** @brief Words of the call's (table, key) -> leader map for n keys: a power of two >= 2n. */
inline int64_t dedup_words(int64_t n) {
  int64_t cap = 2;
  while (cap < 2 * n) cap <<= 1;
  return cap;
}

/**
 * @brief Index of the first occurrence of (t, key) to register in the call's map (a leader gets
 * its own index). Linear probing; the map holds at most n of its >= 2n words, so it ends.
 */
__device__ __forceinline__ int64_t register_key(const UpsertParams& p, int64_t i, int64_t key,
                                                int64_t t) {
  uint64_t h = hash_key(key) + static_cast<uint64_t>(t) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  for (int64_t w = static_cast<int64_t>(h & static_cast<uint64_t>(p.dedup_mask));;
       w = (w + 1) & p.dedup_mask) {
    const int old = atomicCAS(p.dedup + w, -1, static_cast<int>(i));
    if (old == -1) return i;
    if (p.keys[old] == key && p.table_ids[old] == t) return old;
  }
}

/** @brief Bits k (0..15) set where global slot g + k is protected (claimed) in this call; read
 * through L2, where the atomics that set them are done. The array has one word of padding. */
__device__ __forceinline__ uint32_t protected16(const uint32_t* bits, int64_t g) {
  const int64_t w = g >> 5;
  const int sh = static_cast<int>(g & 31);
  uint64_t x = __ldcg(bits + w);
  if (sh > 16) x |= static_cast<uint64_t>(__ldcg(bits + w + 1)) << 32;
  return static_cast<uint32_t>(x >> sh) & 0xffffu;
}

/** @brief Claims global slot g for this call: true when its protect bit was clear. */
__device__ __forceinline__ bool claim(uint32_t* bits, int64_t g) {
  const uint32_t bit = 1u << (g & 31);
  return (atomicOr(bits + (g >> 5), bit) & bit) == 0;
}

/** @brief Mask of the slots g .. g + 15 that lie before `end`. */
__device__ __forceinline__ uint32_t in_range16(int64_t g, int64_t end) {
  const int64_t left = end - g;
  return left >= 16 ? 0xffffu : (left <= 0 ? 0u : (1u << left) - 1u);
}

/**
 * @brief The lowest empty slot of the key's bucket that no key of this call claimed, claimed for
 * the tile (rank 0 does the atomic), or -1 when there is none. Every thread gets the answer.
 * Digests do not change while pass 1 runs (new keys write theirs in pass 3), so plain loads serve.
 */
template <int kVec, typename Tile>
__device__ __forceinline__ int64_t claim_empty(const Tile& tile, const UpsertParams& p,
                                               const KeyHome& home) {
  const int rank = tile.thread_rank();
  const int64_t stride = 16 * kVec * static_cast<int64_t>(tile.size());
  for (int64_t base = home.begin; base < home.end; base += stride) {
    const int64_t g0 = base + 16 * kVec * rank;
    uint32_t empty[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      uint32_t m = 0;
      empty[v] = 0;
      if (g0 + 16 * v < home.end) {
        scan16(p.digests, g0 + 16 * v, home.end, home.digest, &m, &empty[v]);
      }
    }
    for (;;) {
      int64_t mine = -1;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t g = g0 + 16 * v;
        if (mine < 0 && empty[v] != 0) {
          const uint32_t free = empty[v] & ~protected16(p.protect_bits, g);
          if (free != 0) mine = g + __ffs(free) - 1;
        }
      }
      const unsigned any = tile.ballot(mine >= 0);
      if (any == 0) break;  // nothing free in this step: the next one
      const int64_t cand = tile.shfl(mine, __ffs(any) - 1);
      int won = 0;
      if (rank == 0) won = claim(p.protect_bits, cand) ? 1 : 0;
      if (tile.shfl(won, 0) != 0) return cand;
      // lost it to another key: scan the same step again (its bit now reads as set)
    }
  }
  return -1;
}

/**
 * @brief Pass 1: a tile of kPresentTile threads per key, grid-stride. Present keys: slot, touch,
 * protect. Missing keys: register (leader / follower); a leader takes a free empty slot (key and
 * words written, digest in pass 3) or stays kPending for pass 2.
 */
__global__ void __launch_bounds__(kBlockThreads) present_kernel(UpsertParams p) {
  __shared__ unsigned long long block_delta[kSharedSizeTables];
  if (threadIdx.x < kSharedSizeTables) block_delta[threadIdx.x] = 0;
  __syncthreads();
  const auto tile = cg::tiled_partition<kPresentTile>(cg::this_thread_block());
  const int64_t tiles = static_cast<int64_t>(gridDim.x) * (kBlockThreads / kPresentTile);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kPresentTile;
       i < p.n; i += tiles) {
    const int64_t key = p.keys[i];
    const int64_t t = p.table_ids[i];
    KeyHome home;
    if (!key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
      if (tile.thread_rank() == 0) {  // bad table id / bucketless table: not placed
        p.out_slots[i] = -1;
        p.out_flag[i] = false;
      }
      continue;  // the same for the whole tile
    }
    const int64_t g =
        tile_probe<kPresentVec>(tile, p.table_keys, p.digests, key, home, false).hit;
    if (g >= 0) {
      if (tile.thread_rank() == 0) {
        p.out_slots[i] = g - home.layout.offset;
        p.out_flag[i] = false;
        protect(p.protect_bits, g);
        if (p.input_scores != nullptr) {  // duplicates with input words: one of them wins
          const int64_t w[2] = {p.input_scores[2 * i], p.input_scores[2 * i + 1]};
          store_words(p.scores, g, w);
        } else {
          touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g);
        }
      }
      continue;
    }
    int64_t leader = 0;
    if (tile.thread_rank() == 0) leader = register_key(p, i, key, t);
    leader = tile.shfl(leader, 0);
    if (leader != i) {
      if (tile.thread_rank() == 0) p.out_slots[i] = kFollowerBase - leader;
      continue;
    }
    const int64_t e = claim_empty<kPresentVec>(tile, p, home);
    if (tile.thread_rank() != 0) continue;
    if (e < 0) {
      p.out_slots[i] = kPending;
      continue;
    }
    int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
    touched_words(p, i, p.policies[t], p.now[t], w);
    store_words(p.scores, e, w);
    p.table_keys[e] = key;
    p.out_slots[i] = e - home.layout.offset;
    p.out_flag[i] = true;
    if (t < kSharedSizeTables) {
      atomicAdd(&block_delta[t], 1ull);
    } else {
      atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + t), 1ull);
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
 * @brief The victim of a pending key's bucket, claimed for the tile, or -1 when every occupied
 * slot is protected or pinned. Each thread scans 16-slot runs (digests for occupancy, protect
 * bits through L2, pins), loads the candidates' words, then the tile reduces; a lost claim scans
 * again. Words of unclaimed slots do not change during the pass; a slot claimed meanwhile may be
 * read half-written, but then its claim fails.
 */
template <typename Tile>
__device__ __forceinline__ int64_t claim_victim(const Tile& tile, const UpsertParams& p,
                                                const KeyHome& home, int64_t policy,
                                                bool use_fn) {
  const int rank = tile.thread_rank();
  const int64_t step = 16 * static_cast<int64_t>(tile.size());
  for (;;) {
    Candidate best{-1, 0, 0, 0.0};
    for (int64_t g = home.begin + 16 * rank; g < home.end; g += step) {
      uint32_t m = 0, e = 0;
      scan16(p.digests, g, home.end, home.digest, &m, &e);
      uint32_t cand = ~e & in_range16(g, home.end) & ~protected16(p.protect_bits, g);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (((cand >> k) & 1u) == 0) continue;
        if (p.pins != nullptr && p.pins[g + k] > 0) continue;
        Candidate c{g + k, 0, 0, use_fn ? p.fn_scores[g + k] : 0.0};
        if (!use_fn) {
          int64_t w[2];
          load_words(p.scores, g + k, w);
          c.w0 = w[0];
          c.w1 = w[1];
        }
        if (evicts_before(c, best, policy, use_fn)) best = c;
      }
    }
    for (int o = static_cast<int>(tile.size()) / 2; o > 0; o >>= 1) {
      Candidate other;
      other.g = tile.shfl_xor(best.g, o);
      other.w0 = tile.shfl_xor(best.w0, o);
      other.w1 = tile.shfl_xor(best.w1, o);
      other.f = tile.shfl_xor(best.f, o);
      if (evicts_before(other, best, policy, use_fn)) best = other;
    }
    if (best.g < 0) return -1;
    int won = 0;
    if (rank == 0) won = claim(p.protect_bits, best.g) ? 1 : 0;
    if (tile.shfl(won, 0) != 0) return best.g;
  }
}

/**
 * @brief Pass 2: each warp reads the states of 32 consecutive keys; its 4 tiles of kEvictTile
 * share the pending ones (tile k takes the k-th, (k+4)-th, ... of them). A pending key of an
 * evicting table takes a victim; otherwise (NO_EVICTION, or nothing left to evict) slot -1.
 */
__global__ void __launch_bounds__(kBlockThreads) evict_kernel(UpsertParams p) {
  using Tile = cg::thread_block_tile<kEvictTile>;
  const auto block = cg::this_thread_block();
  const Tile tile = cg::tiled_partition<kEvictTile>(block);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int which = lane / kEvictTile;  // this tile's number in its warp
  constexpr int kTilesPerWarp = 32 / kEvictTile;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlockThreads / 32);
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / 32 * 32;
       base < p.n; base += warps * 32) {
    const int64_t mine = base + lane;
    const bool pending = mine < p.n && p.out_slots[mine] == kPending;
    unsigned todo = __ballot_sync(0xffffffffu, pending);
    // drop the pending keys of the tiles before this one, then take every kTilesPerWarp-th
    for (int k = 0; k < which && todo; ++k) todo &= todo - 1;
    while (todo != 0) {
      const int64_t i = base + __ffs(todo) - 1;
      for (int k = 0; k < kTilesPerWarp && todo; ++k) todo &= todo - 1;
      const int64_t key = p.keys[i];
      const int64_t t = p.table_ids[i];
      KeyHome home;
      key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home);  // pass 1 placed it
      const int64_t policy = p.policies[t];
      int64_t g = -1;
      if (policy_can_evict(policy)) {
        const bool use_fn = p.has_fn != nullptr && p.has_fn[t] != 0;
        g = claim_victim(tile, p, home, policy, use_fn);
      }
      if (tile.thread_rank() != 0) continue;
      p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
      p.out_flag[i] = g >= 0;
      if (g < 0) continue;
      if (p.mode == UpsertMode::kInsertAndEvict) {
        int64_t old[2];
        load_words(p.scores, g, old);
        p.ev_flag[i] = true;
        p.ev_keys[i] = p.table_keys[g];
        p.ev_slots[i] = g - home.layout.offset;
        p.ev_scores[2 * i] = old[0];
        p.ev_scores[2 * i + 1] = old[1];
      }
      int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
      touched_words(p, i, policy, p.now[t], w);
      store_words(p.scores, g, w);
      p.table_keys[g] = key;
      p.digests[g] = home.digest;
    }
  }
}

/**
 * @brief Pass 3, a thread per key: a leader placed in an empty slot writes its digest (the key is
 * findable from here on); a follower takes its leader's answer and touches the leader's slot
 * (input words: one occurrence's words win).
 */
__global__ void __launch_bounds__(kBlockThreads) finish_kernel(UpsertParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (i >= p.n) return;
  const int64_t s = p.out_slots[i];
  if (s >= 0) {
    if (!p.out_flag[i]) return;  // a present key
    const int64_t t = p.table_ids[i];
    const TableLayout layout = table_layout(p.slot_offsets, p.bucket_caps, t);
    p.digests[layout.offset + s] = digest_of(hash_key(p.keys[i]));  // again after an eviction
    return;
  }
  if (s > kFollowerBase) return;  // not placed (-1)
  const int64_t leader = kFollowerBase - s;
  const int64_t ls = p.out_slots[leader];  // a leader's answer is final after pass 2
  p.out_slots[i] = ls;
  p.out_flag[i] = p.out_flag[leader];
  if (ls < 0) return;
  const int64_t t = p.table_ids[i];
  const int64_t g = table_layout(p.slot_offsets, p.bucket_caps, t).offset + ls;
  if (p.input_scores != nullptr) {
    const int64_t w[2] = {p.input_scores[2 * i], p.input_scores[2 * i + 1]};
    store_words(p.scores, g, w);
  } else {
    touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g);
  }
}

/** @brief Blocks of a grid-stride kernel: enough to fill the GPU, never more than the work. */
inline int grid_for(int64_t n, int64_t per_block) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::min<int64_t>(blocks_for(n, per_block), int64_t{sms} * kBlocksPerSm));
}

/**
 * @brief Launcher: present, evict, finish. `p.protect_bits` must be zeroed, `p.dedup` filled
 * with -1 (dedup_words(n) words); `p.now` set (the ops resolve it for every inserting call).
 */
inline void launch_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  present_kernel<<<grid_for(p.n, kBlockThreads / kPresentTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  evict_kernel<<<grid_for(p.n, kBlockThreads), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  finish_kernel<<<blocks_for(p.n, kBlockThreads), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Selector: the key-parallel engine has one variant (kInsert / kFindOrInsert /
 * kInsertAndEvict; erase and insert_at stay on the bucket-ordered engine). */
inline void select_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  DEMB_CHECK(p.mode == UpsertMode::kInsert || p.mode == UpsertMode::kFindOrInsert ||
                 p.mode == UpsertMode::kInsertAndEvict,
             "dynamicemb table (CUDA): the key-parallel engine only inserts");
  DEMB_CHECK_VALUE(p.n <= INT32_MAX, "dynamicemb table (CUDA): at most 2^31-1 keys per call, got ",
                   p.n, "; split the call");
  launch_upsert_parallel(p, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
