/**
 * @file table_upsert_parallel.cuh
 * @brief The key-parallel engine behind insert, find_or_insert and insert_and_evict on CUDA, run
 * when the ops get deterministic=false (DEMB_DETERMINISM_MODE=0). Kernels, launcher, selector
 * (STYLE rule 7); the params are table_upsert.cuh's UpsertParams.
 *
 * Lock-free: no thread ever waits for another. A slot is claimed by setting its bit in the call's
 * protect bits with one atomicOr; the bit that was clear before wins the slot, a claim that finds
 * it set lost it to another key and tries the next candidate. A claimed bit is never cleared during
 * the call, so a slot is handed out at most once per call and never both kept and evicted. Three
 * kernels:
 *
 *  1. present pass (a tile of 4 threads per key, one key per tile, like find): a key already in its
 *     bucket keeps its slot, is touched with atomics and its slot protected. A missing key first
 *     registers in a per-call open-addressing map of (table, key) -> first index (atomicCAS on an
 *     int32 word), so each distinct missing key has exactly one leader; the other occurrences
 *     follow it in pass 3. A leader claims the lowest empty slot of its bucket that no other leader
 *     claimed (it tries the lowest empty slot it does not know to be claimed; the word a lost
 *     atomicOr returns tells it which slots of that word are taken) and writes its key and score
 *     words there, but not its digest: a probe of this pass never matches a key placed in it, so
 *     every occurrence of a key sees the same table. A leader that finds no free empty slot is
 *     appended to the call's pending list (listed per block in shared memory, then one atomicAdd
 *     per block reserves its place).
 *  2. evict pass (a warp per pending leader, grid-stride over the list, as many warps as fit on the
 *     GPU at once): a leader of an evicting table takes the victim, the occupied slot of lowest
 *     rank (then lowest slot) that is neither protected nor pinned. Each lane reads 4 adjacent
 *     slots (their digests, protect bits, pins and score words: the warp's word loads are one
 *     contiguous 2 KB run for a 128-slot bucket, all in flight at once), then a warp reduction
 *     picks the victim, lane 0 claims it, reports it (insert_and_evict: the words it read) and
 *     writes key, words and digest. Every present key of the call was protected by the end of
 *     pass 1, so no key of the call is a victim.
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
constexpr int kEvictTile = 16;   // threads per pending key in the evict pass (two keys a warp)
constexpr int kEvictSlots = 8;   // adjacent slots per thread there: 16 x 8 = 128 a step
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

/**
 * @brief Bits k (0..15) set where global slot g + k lies in the 32-slot protect word that starts at
 * global slot `word_base` and its bit in `word` is set: what a returned atomicOr word says about
 * the 16 slots at g.
 */
__device__ __forceinline__ uint32_t claimed16(uint32_t word, int64_t word_base, int64_t g) {
  const int64_t d = word_base - g;  // where the word starts, relative to g
  if (d >= 16 || d <= -32) return 0u;
  const uint64_t w = word;
  return static_cast<uint32_t>((d >= 0 ? (w << d) : (w >> -d)) & 0xffffu);
}

/** @brief Claims global slot g for this call: true when its protect bit was clear. */
__device__ __forceinline__ bool claim(uint32_t* bits, int64_t g) {
  const uint32_t bit = 1u << (g & 31);
  return (atomicOr(bits + (g >> 5), bit) & bit) == 0;
}

/** @brief claim() that also hands back the protect word as it was before the atomicOr. */
__device__ __forceinline__ uint32_t claim_word(uint32_t* bits, int64_t g) {
  return atomicOr(bits + (g >> 5), 1u << (g & 31));
}

/**
 * @brief The lowest empty slot of the key's bucket that no key of this call claimed, claimed for
 * the tile (rank 0 does the atomic), or -1 when there is none. Every thread gets the answer.
 * Digests do not change while pass 1 runs (new keys write theirs in pass 3), so plain loads serve.
 * No read of the protect bits first: the tile tries the lowest empty slot it does not know to be
 * claimed, and a lost atomicOr returns the word, which marks every claimed slot it covers. Claims
 * are never undone, so each won claim is the lowest empty slot still unclaimed at that moment.
 */
template <int kVec, typename Tile>
__device__ __forceinline__ int64_t claim_empty(const Tile& tile, const UpsertParams& p,
                                               const KeyHome& home) {
  const int rank = tile.thread_rank();
  const int64_t stride = 16 * kVec * static_cast<int64_t>(tile.size());
  for (int64_t base = home.begin; base < home.end; base += stride) {
    const int64_t g0 = base + 16 * kVec * rank;
    uint32_t free[kVec];  // empty and not known to be claimed
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      uint32_t m = 0;
      free[v] = 0;
      if (g0 + 16 * v < home.end) {
        scan16(p.digests, g0 + 16 * v, home.end, home.digest, &m, &free[v]);
      }
    }
    for (;;) {
      int64_t mine = -1;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        if (mine < 0 && free[v] != 0) mine = g0 + 16 * v + __ffs(free[v]) - 1;
      }
      const unsigned any = tile.ballot(mine >= 0);
      if (any == 0) break;  // nothing free in this step: the next one
      const int64_t cand = tile.shfl(mine, __ffs(any) - 1);
      uint32_t word = 0;
      if (rank == 0) word = claim_word(p.protect_bits, cand);
      word = tile.shfl(word, 0);
      if (((word >> (cand & 31)) & 1u) == 0) return cand;
      // lost it: every slot the returned word marks is taken, the candidate among them
      const int64_t word_base = cand & ~int64_t{31};
#pragma unroll
      for (int v = 0; v < kVec; ++v) free[v] &= ~claimed16(word, word_base, g0 + 16 * v);
    }
  }
  return -1;
}

/**
 * @brief What one block of the present pass gathers before it writes to global memory once: its
 * new keys per table (added to `sizes`) and its pending leaders (appended to the call's list with
 * one atomicAdd on the count per block, not one per key: a single counter that every new key of an
 * evicting call hit would serialise them at L2).
 */
struct PresentBlock {
  unsigned long long delta[kSharedSizeTables];
  int pending;                                  // leaders listed in `list`
  int base;                                     // where they go in the call's list
  int32_t list[kBlockThreads / kPresentTile];   // one key per tile at most
};

/**
 * @brief Pass 1 for key i, by its tile. Present keys: slot, touch, protect. Missing keys: register
 * (leader / follower); a leader takes a free empty slot (key and words written, digest in pass 3;
 * the table's size counted in the block's tally) or joins the pending list for pass 2.
 */
template <typename Tile>
__device__ __forceinline__ void present_key(const Tile& tile, const UpsertParams& p, int64_t i,
                                            PresentBlock& block) {
  const int64_t key = p.keys[i];
  const int64_t t = p.table_ids[i];
  const bool lead = tile.thread_rank() == 0;
  KeyHome home;
  if (!key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    if (lead) {  // bad table id / bucketless table: not placed
      p.out_slots[i] = -1;
      p.out_flag[i] = false;
    }
    return;  // the same for the whole tile
  }
  const int64_t g = tile_probe<kPresentVec>(tile, p.table_keys, p.digests, key, home, false).hit;
  if (g >= 0) {
    if (lead) {
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
    return;
  }
  int64_t leader = 0;
  if (lead) leader = register_key(p, i, key, t);
  leader = tile.shfl(leader, 0);
  if (leader != i) {
    if (lead) p.out_slots[i] = kFollowerBase - leader;
    return;
  }
  const int64_t e = claim_empty<kPresentVec>(tile, p, home);
  if (!lead) return;
  if (e < 0) {
    p.out_slots[i] = kPending;
    block.list[atomicAdd(&block.pending, 1)] = static_cast<int32_t>(i);
    return;
  }
  int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
  touched_words(p, i, p.policies[t], p.now[t], w);
  store_words(p.scores, e, w);
  p.table_keys[e] = key;
  p.out_slots[i] = e - home.layout.offset;
  p.out_flag[i] = true;
  if (t < kSharedSizeTables) {
    atomicAdd(&block.delta[t], 1ull);
  } else {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + t), 1ull);
  }
}

/**
 * @brief Pass 1: one tile of kPresentTile threads per key (no grid-stride loop: blocks that finish
 * early are replaced at once, so the slow keys of one block hold up nobody). New keys per table
 * and pending leaders are gathered per block in shared memory and written out once per block.
 */
__global__ void __launch_bounds__(kBlockThreads) present_kernel(UpsertParams p) {
  __shared__ PresentBlock block;
  if (threadIdx.x < kSharedSizeTables) block.delta[threadIdx.x] = 0;
  if (threadIdx.x == 0) block.pending = 0;
  __syncthreads();
  const auto tile = cg::tiled_partition<kPresentTile>(cg::this_thread_block());
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kPresentTile;
  if (i < p.n) present_key(tile, p, i, block);  // i is the same for the whole tile
  __syncthreads();
  if (threadIdx.x == 0 && block.pending > 0) {
    block.base = atomicAdd(p.pending_count, block.pending);
  }
  if (threadIdx.x < kSharedSizeTables && threadIdx.x < p.num_tables &&
      block.delta[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + threadIdx.x),
              block.delta[threadIdx.x]);
  }
  __syncthreads();
  if (threadIdx.x < block.pending) p.pending[block.base + threadIdx.x] = block.list[threadIdx.x];
}

/**
 * @brief Bit k set where slot g0 + k (k < kEvictSlots) lies before `end` and is occupied,
 * unprotected and unpinned; `w[k]` gets its score words (with `use_fn`: the score-function rank's
 * bits in w[k].x). All loads are issued before any is used. The usual case (8 aligned slots inside
 * the bucket) reads the 8 digests with one 8-byte load and the protect bits with one word.
 */
__device__ __forceinline__ uint32_t victim_candidates(const UpsertParams& p, int64_t g0,
                                                      int64_t end, bool use_fn,
                                                      longlong2 (&w)[kEvictSlots]) {
  static_assert(kEvictSlots == 8, "the fast path reads 8 digests and one byte of protect bits");
  uint32_t ok = 0;
  if (g0 + kEvictSlots <= end && (g0 & 7) == 0) {
    const uint2 d = *reinterpret_cast<const uint2*>(p.digests + g0);
    const uint32_t bits = __ldcg(p.protect_bits + (g0 >> 5));
    const longlong2* words = reinterpret_cast<const longlong2*>(p.scores + 2 * g0);
#pragma unroll
    for (int k = 0; k < kEvictSlots; ++k) {
      w[k] = use_fn ? make_longlong2(__double_as_longlong(p.fn_scores[g0 + k]), 0) : words[k];
    }
    const uint32_t empty = byte_matches(d.x ^ 0x01010101u, 1) | (byte_matches(d.y ^ 0x01010101u, 1) << 4);
    ok = ~empty & ~(bits >> (g0 & 31)) & 0xffu;
  } else {
#pragma unroll
    for (int k = 0; k < kEvictSlots; ++k) {
      const int64_t g = g0 + k;
      w[k] = make_longlong2(0, 0);
      if (g >= end) continue;
      if (p.digests[g] != 0 && !is_protected(p.protect_bits, g)) ok |= 1u << k;
      w[k] = use_fn ? make_longlong2(__double_as_longlong(p.fn_scores[g]), 0)
                    : *reinterpret_cast<const longlong2*>(p.scores + 2 * g);
    }
  }
  if (p.pins != nullptr) {
#pragma unroll
    for (int k = 0; k < kEvictSlots; ++k) {
      if (((ok >> k) & 1u) != 0 && p.pins[g0 + k] > 0) ok &= ~(1u << k);
    }
  }
  return ok;
}

/**
 * @brief The victim of a pending key's bucket, claimed for the tile (its slot and the words read
 * for it), or slot -1 when every occupied slot is protected or pinned. Each thread
 * reads kEvictSlots adjacent slots a step (digest, protect bit through L2, pin, score words or
 * score-function rank), all loads issued before any is used (a tile's word loads are one
 * contiguous 2 KB run for a 128-slot bucket), then the tile reduces and rank 0 claims; a lost
 * claim scans again. Words of unclaimed slots do not change during the pass (only a claimer
 * writes a slot); a slot claimed meanwhile may be read half-written, but then its claim fails. A
 * digest read stale is harmless: a victim's digest changes from one key's to another's, and a
 * slot that reads empty was claimed in pass 1 (a leader is pending only when every empty slot of
 * its bucket was claimed), so it is no candidate either way. With a score function the rank's
 * bits ride in the first word's register (one set of registers for either kind of rank).
 */
template <typename Tile>
__device__ __forceinline__ Candidate claim_victim(const Tile& tile, const UpsertParams& p,
                                                  const KeyHome& home, int64_t policy,
                                                  bool use_fn) {
  const int rank = tile.thread_rank();
  for (;;) {
    Candidate best{-1, 0, 0, 0.0};
    for (int64_t base = home.begin; base < home.end; base += kEvictTile * kEvictSlots) {
      const int64_t g0 = base + kEvictSlots * rank;
      longlong2 w[kEvictSlots];
      const uint32_t ok = victim_candidates(p, g0, home.end, use_fn, w);
#pragma unroll
      for (int k = 0; k < kEvictSlots; ++k) {
        if (((ok >> k) & 1u) == 0) continue;
        const Candidate c = use_fn ? Candidate{g0 + k, 0, 0, __longlong_as_double(w[k].x)}
                                   : Candidate{g0 + k, w[k].x, w[k].y, 0.0};
        if (evicts_before(c, best, policy, use_fn)) best = c;
      }
    }
    for (int o = kEvictTile / 2; o > 0; o >>= 1) {
      Candidate other;
      other.g = tile.shfl_xor(best.g, o);
      other.w0 = tile.shfl_xor(best.w0, o);
      other.w1 = tile.shfl_xor(best.w1, o);
      other.f = tile.shfl_xor(best.f, o);
      if (evicts_before(other, best, policy, use_fn)) best = other;
    }
    if (best.g < 0) return best;
    int won = 0;
    if (rank == 0) won = claim(p.protect_bits, best.g) ? 1 : 0;
    if (tile.shfl(won, 0) != 0) return best;
  }
}

/**
 * @brief Pass 2: a tile of kEvictTile threads per pending leader, grid-stride over the pending
 * list (its length is read here, on the device: no synchronisation). A leader of an evicting
 * table takes a victim; otherwise (NO_EVICTION, or nothing left to evict) slot -1.
 */
__global__ void __launch_bounds__(kBlockThreads, 4) evict_kernel(UpsertParams p) {
  const auto tile = cg::tiled_partition<kEvictTile>(cg::this_thread_block());
  const int64_t tiles = static_cast<int64_t>(gridDim.x) * (kBlockThreads / kEvictTile);
  const int64_t count = *p.pending_count;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kEvictTile;
       w < count; w += tiles) {
    const int64_t i = p.pending[w];
    const int64_t key = p.keys[i];
    const int64_t t = p.table_ids[i];
    KeyHome home;
    key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home);  // pass 1 placed it
    const int64_t policy = p.policies[t];
    const bool use_fn = p.has_fn != nullptr && p.has_fn[t] != 0;
    Candidate victim{-1, 0, 0, 0.0};
    if (policy_can_evict(policy)) victim = claim_victim(tile, p, home, policy, use_fn);
    const int64_t g = victim.g;
    if (tile.thread_rank() != 0) continue;
    p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
    p.out_flag[i] = g >= 0;
    if (g < 0) continue;
    if (p.mode == UpsertMode::kInsertAndEvict) {
      int64_t old[2] = {victim.w0, victim.w1};  // read in the scan; unchanged until this write
      if (use_fn) load_words(p.scores, g, old);
      p.ev_flag[i] = true;
      p.ev_keys[i] = p.table_keys[g];
      p.ev_slots[i] = g - home.layout.offset;
      p.ev_scores[2 * i] = old[0];
      p.ev_scores[2 * i + 1] = old[1];
    }
    int64_t nw[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
    touched_words(p, i, policy, p.now[t], nw);
    store_words(p.scores, g, nw);
    p.table_keys[g] = key;
    p.digests[g] = home.digest;
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

/**
 * @brief Blocks of the evict pass: as many as the GPU holds at once (its occupancy, computed once),
 * so the grid-stride loop leaves no second wave behind; never more than n keys need.
 */
inline int evict_grid(int64_t n) {
  static int per_sm = 0;  // the same for every device of a process in practice; a race only
                          // recomputes it
  if (per_sm == 0) {
    int blocks = 0;
    C10_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, evict_kernel, kBlockThreads, 0));
    per_sm = std::max(blocks, 1);
  }
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(
      std::min<int64_t>(blocks_for(n, kBlockThreads / kEvictTile), int64_t{sms} * per_sm));
}

/**
 * @brief Launcher: present, evict, finish. `p.protect_bits` must be zeroed, `p.pending_count`
 * zeroed, `p.pending` hold n words, `p.dedup` filled with -1 (dedup_words(n) words); `p.now` set
 * (the ops resolve it for every inserting call).
 */
inline void launch_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  present_kernel<<<blocks_for(p.n, kBlockThreads / kPresentTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  evict_kernel<<<evict_grid(p.n), kBlockThreads, 0, stream>>>(p);
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
