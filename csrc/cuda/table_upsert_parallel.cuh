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
 *     every occurrence of a key sees the same table; the slot and digest go to the call's placed
 *     list, and a follower to its follower list. A leader that finds no free empty slot is
 *     appended to the call's pending list, as its key and its index | table << 32: everything the
 *     next pass needs about it in one 16-byte entry. Each list is gathered per block in shared
 *     memory, then one atomicAdd per block reserves its place.
 *  2. evict pass (a tile of 16 threads per pending leader, grid-stride over the list, as many
 *     tiles as fit on the GPU at once): a leader of an evicting table takes the victim, the
 *     occupied slot of lowest rank (then lowest slot) that is neither protected nor pinned. Each
 *     thread reads 8 slots (digests, pins and rank words, all loads in flight at once), a tile
 *     reduction picks the lowest, rank 0 claims it, reports it (insert_and_evict: at the entry's
 *     place w in the list, with its flag and table, and one count per block, so the op reads
 *     (pending, evicted) once and, when every pending leader evicted, returns the first `evicted`
 *     entries as they are: no scan) and writes key, words and digest. In a bucket of up to 128
 *     slots the protect bits are not read at all: a claim of a protected slot fails like one lost
 *     to another key, and the word its atomicOr returns drops every protected or claimed slot it
 *     covers from the candidates, which stay in registers. Every present key of the call was
 *     protected by the end of pass 1, so no key of the call is a victim. Then the pass writes the
 *     digests of the placed list (grid-stride): those keys are findable from here on. A victim
 *     scan that reads such a digest meanwhile sees a slot claimed in pass 1, whose claim fails.
 *  3. finish pass (grid-stride over the follower list; nothing to do when the keys are distinct):
 *     followers take their leader's slot and flag and touch its words (atomics: c occurrences add
 *     c counts).
 *
 * What holds whatever the schedule: each (table, key) is present at most once; every returned slot
 * holds its key; present keys keep their slots; each victim is evicted once and reported with the
 * words it had; per bucket, the new keys fill the lowest empty slots (as many as there are new
 * keys), and the victims are the k lowest-ranked unprotected, unpinned slots, k the deterministic
 * engine's (claims are monotone, so a slot that survives unclaimed was a candidate of every victim
 * choice and ranks at or above each victim). What depends on the schedule: which new key lands in
 * which of those slots, when a bucket gets more new keys than it can take, which get in, and the
 * order of the evicted report (the pending list's).
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
constexpr unsigned long long kPlacedSlotMask = (1ull << 56) - 1;  // placed entry: slot | digest << 56

/** @brief Words of the call's (table, key) -> leader map for n keys: a power of two >= 2n. */
inline int64_t dedup_words(int64_t n) {
  int64_t cap = 2;
  while (cap < 2 * n) cap <<= 1;
  return cap;
}

/**
 * @brief Index of the first occurrence of (t, key) to register in the call's map (a leader gets
 * its own index). Linear probing; the map holds at most n of its >= 2n words, so it ends. With
 * `unique_keys` (the caller's promise of distinct keys) there is no map: every key leads itself,
 * which saves each new key an L2 round trip (10-16% of an inserting call on the H200).
 */
__device__ __forceinline__ int64_t register_key(const UpsertParams& p, int64_t i, int64_t key,
                                                int64_t t) {
  if (p.unique_keys) return i;  // the caller's promise: every key its own leader, no map
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
 * new keys per table (added to `sizes`), its pending leaders, the leaders it placed in empty slots
 * and its followers (each appended to the call's list with one atomicAdd on its count per block,
 * not one per key: a single counter that every new key of an evicting call hit would serialise
 * them at L2). A pending entry is the key and its index | table << 32, so the evict pass reads
 * everything it needs about the key with one 16-byte load; a placed entry is the global slot |
 * digest << 56.
 */
struct PresentBlock {
  unsigned long long delta[kSharedSizeTables];
  int pending;                                     // leaders listed in `list`
  int base;                                        // where they go in the call's list
  longlong2 list[kBlockThreads / kPresentTile];    // one key per tile at most
  int placed_n, placed_base;                       // leaders placed in empty slots
  int follow_n, follow_base;                       // followers
  unsigned long long placed[kBlockThreads / kPresentTile];
  int follow[kBlockThreads / kPresentTile];
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
        touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g, touch_count(p.counts, i));
      }
    }
    return;
  }
  int64_t leader = 0;
  if (lead) leader = register_key(p, i, key, t);
  leader = tile.shfl(leader, 0);
  if (leader != i) {
    if (lead) {
      p.out_slots[i] = kFollowerBase - leader;
      block.follow[atomicAdd(&block.follow_n, 1)] = static_cast<int>(i);
    }
    return;
  }
  const int64_t e = claim_empty<kPresentVec>(tile, p, home);
  if (!lead) return;
  if (e < 0) {
    p.out_slots[i] = kPending;
    block.list[atomicAdd(&block.pending, 1)] = make_longlong2(key, i | (t << 32));
    return;
  }
  int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
  touched_words(p, i, p.policies[t], p.now[t], w);
  store_words(p.scores, e, w);
  p.table_keys[e] = key;
  p.out_slots[i] = e - home.layout.offset;
  p.out_flag[i] = true;
  block.placed[atomicAdd(&block.placed_n, 1)] =
      static_cast<unsigned long long>(e) | (static_cast<unsigned long long>(home.digest) << 56);
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
  if (threadIdx.x == 0) {
    block.pending = 0;
    block.placed_n = 0;
    block.follow_n = 0;
  }
  __syncthreads();
  const auto tile = cg::tiled_partition<kPresentTile>(cg::this_thread_block());
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kPresentTile;
  if (i < p.n) present_key(tile, p, i, block);  // i is the same for the whole tile
  __syncthreads();
  if (threadIdx.x == 0 && block.pending > 0) {
    block.base = atomicAdd(p.pending_count, block.pending);
  }
  if (threadIdx.x == 32 && block.placed_n > 0) {
    block.placed_base = atomicAdd(p.placed_count, block.placed_n);
  }
  if (threadIdx.x == 64 && block.follow_n > 0) {
    block.follow_base = atomicAdd(p.follower_count, block.follow_n);
  }
  if (threadIdx.x < kSharedSizeTables && threadIdx.x < p.num_tables &&
      block.delta[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + threadIdx.x),
              block.delta[threadIdx.x]);
  }
  __syncthreads();
  if (threadIdx.x < block.pending) {
    reinterpret_cast<longlong2*>(p.pending)[block.base + threadIdx.x] = block.list[threadIdx.x];
  }
  if (threadIdx.x < block.placed_n) {
    p.placed[block.placed_base + threadIdx.x] = block.placed[threadIdx.x];
  }
  if (threadIdx.x < block.follow_n) {
    p.followers[block.follow_base + threadIdx.x] = block.follow[threadIdx.x];
  }
}

/**
 * @brief A victim candidate of the evict pass as one lexicographic order: (hi, lo, global slot),
 * lowest evicted first. hi / lo are the slot's rank (ranks_below / fn_ranks_below of
 * score_policy.h recast as integers, see rank_at); "no candidate" is all INT64_MAX, after every
 * slot: one plain comparison, whatever the policy.
 */
struct Victim {
  int64_t hi, lo, g;
};

constexpr Victim kNoVictim{INT64_MAX, INT64_MAX, INT64_MAX};

__device__ __forceinline__ bool before(const Victim& a, const Victim& b) {
  if (a.hi != b.hi) return a.hi < b.hi;
  if (a.lo != b.lo) return a.lo < b.lo;
  return a.g < b.g;
}

/** @brief The arrays a victim scan reads. */
struct ScanView {
  const uint8_t* digests;
  const int64_t* scores;
  const double* fn_scores;
  const int32_t* pins;
  uint32_t* protect_bits;
};

/** @brief What ranks a table's slots for eviction (score_policy.h): how the evict pass reads it. */
enum class RankBy : int {
  kWord0 = 0,  ///< score word 0 alone (every policy but COMPOUND)
  kPair = 1,   ///< (word 0, word 1): COMPOUND's count, then timestamp
  kFn = 2,     ///< the score function's result (fn_scores)
};

/**
 * @brief Slot k's rank as (hi, lo), ordered like the deterministic engine's evicts_before. kFn: the
 * double as an integer whose order is fn_ranks_below's (NaN lowest, -0.0 equal to 0.0, then
 * ascending).
 */
template <RankBy kRank>
__device__ __forceinline__ void rank_at(const int64_t* words, const double* fn, int k, int64_t* hi,
                                        int64_t* lo) {
  if constexpr (kRank == RankBy::kFn) {
    double f = fn[k];
    if (f == 0.0) f = 0.0;  // one zero
    int64_t b = __double_as_longlong(f);
    if (b < 0) b ^= INT64_MAX;  // negative doubles: larger magnitude, lower
    *hi = f != f ? INT64_MIN : b;
    *lo = 0;
  } else if constexpr (kRank == RankBy::kPair) {
    const longlong2 w = reinterpret_cast<const longlong2*>(words)[k];
    *hi = w.x;
    *lo = w.y;
  } else {
    *hi = words[2 * k];  // word 0 only: half the registers of the pair
    *lo = 0;
  }
}

/**
 * @brief The thread's best candidate of one step of the evict pass: its kEvictSlots adjacent
 * slots s0 + k. All loads are issued before any is used, with immediate offsets from base
 * pointers (measured on the H200 against a layout where the tile's k-th loads are 16 adjacent
 * slots: no clear difference). A slot is a candidate when it lies before `end` and is occupied, unprotected (its bit
 * read through L2) and unpinned.
 */
template <RankBy kRank>
__device__ __forceinline__ Victim read_candidates(const ScanView& p, int64_t s0,
                                                  int64_t end) {
  const int64_t lim = end - s0;  // slot k lies in the bucket when k < lim
  const uint8_t* dp = p.digests + s0;
  const int64_t* wp = p.scores + 2 * s0;
  const double* fp = kRank == RankBy::kFn ? p.fn_scores + s0 : nullptr;
  const uint32_t* bp = p.protect_bits + (s0 >> 5);
  const int r = static_cast<int>(s0 & 31);
  uint32_t d[kEvictSlots], bits[kEvictSlots];
  int64_t hi[kEvictSlots], lo[kEvictSlots];
#pragma unroll
  for (int k = 0; k < kEvictSlots; ++k) {
    d[k] = 0;
    bits[k] = 0;
    hi[k] = lo[k] = 0;
    if (k >= lim) continue;
    d[k] = dp[k];
    bits[k] = __ldcg(bp + ((r + k) >> 5)) >> ((r + k) & 31);
    rank_at<kRank>(wp, fp, k, &hi[k], &lo[k]);
  }
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < kEvictSlots; ++k) {
    if (d[k] != 0 && (bits[k] & 1u) == 0) m |= 1u << k;
  }
  if (p.pins != nullptr) {
    const int32_t* pp = p.pins + s0;
#pragma unroll
    for (int k = 0; k < kEvictSlots; ++k) {
      if (((m >> k) & 1u) != 0 && pp[k] > 0) m &= ~(1u << k);
    }
  }
  Victim best = kNoVictim;
#pragma unroll
  for (int k = 0; k < kEvictSlots; ++k) {
    const Victim c{hi[k], lo[k], s0 + k};
    if (((m >> k) & 1u) != 0 && before(c, best)) best = c;
  }
  return best;
}

/**
 * @brief read_candidates for a bucket of one step, without the protect bits: bit k of the result
 * set where slot s0 + k lies before `end` and is occupied and unpinned, its rank in
 * hi[k] / lo[k]. Protected slots are found by the claims instead (claim_victim).
 */
template <RankBy kRank>
__device__ __forceinline__ uint32_t occupied_ranks(const ScanView& p, int64_t s0, int64_t end,
                                                   int64_t (&hi)[kEvictSlots],
                                                   int64_t (&lo)[kEvictSlots]) {
  const int64_t lim = end - s0;
  const uint8_t* dp = p.digests + s0;
  const int64_t* wp = p.scores + 2 * s0;
  const double* fp = kRank == RankBy::kFn ? p.fn_scores + s0 : nullptr;
  uint32_t d[kEvictSlots];
#pragma unroll
  for (int k = 0; k < kEvictSlots; ++k) {
    d[k] = 0;
    hi[k] = lo[k] = 0;
    if (k >= lim) continue;
    d[k] = dp[k];
    rank_at<kRank>(wp, fp, k, &hi[k], &lo[k]);
  }
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < kEvictSlots; ++k) m |= static_cast<uint32_t>(d[k] != 0) << k;
  if (p.pins != nullptr) {
    const int32_t* pp = p.pins + s0;
#pragma unroll
    for (int k = 0; k < kEvictSlots; ++k) {
      if (((m >> k) & 1u) != 0 && pp[k] > 0) m &= ~(1u << k);
    }
  }
  return m;
}

/** @brief The tile's best of its threads' candidates; every thread gets it. */
template <typename Tile>
__device__ __forceinline__ Victim tile_best(const Tile& tile, Victim best) {
#pragma unroll
  for (int o = kEvictTile / 2; o > 0; o >>= 1) {
    Victim other;
    other.hi = tile.shfl_xor(best.hi, o);
    other.lo = tile.shfl_xor(best.lo, o);
    other.g = tile.shfl_xor(best.g, o);
    if (before(other, best)) best = other;
  }
  return best;
}

/**
 * @brief The victim of a pending key's bucket, claimed for the tile: its global slot, or -1 when
 * every occupied slot is protected or pinned. Each thread reads kEvictSlots slots a step
 * (read_candidates), the tile reduces and rank 0 claims. Words of unclaimed slots do not change
 * during the pass (only a claimer writes a slot); a slot claimed meanwhile may be read
 * half-written, but then its claim fails. A digest read stale is harmless: a victim's digest
 * changes from one key's to another's, and a slot that reads empty was claimed in pass 1 (a leader
 * is pending only when every empty slot of its bucket was claimed), so it is no candidate either
 * way.
 *
 * A lost claim scans again (the bucket's lines are in L2 by then); claims are never undone, so a
 * won claim is the lowest candidate still unclaimed at that moment.
 */
template <RankBy kRank, typename Tile>
__device__ __forceinline__ int64_t claim_victim(const Tile& tile, const ScanView& p,
                                                const KeyHome& home) {
  const int rank = tile.thread_rank();
  constexpr int64_t kStep = static_cast<int64_t>(kEvictTile) * kEvictSlots;
  const int64_t first = kEvictSlots * rank;  // this thread's first slot of a step
  if (home.end - home.begin <= kStep) {
    // One step: the candidates stay in registers and the protect bits are not read; a claim
    // (atomicOr) finds out whether its slot was free, and the word it returns marks every
    // protected or claimed slot it covers, which leave the candidates. Slots only ever leave
    // (bits are never cleared), so a won claim is the lowest slot still free at that moment.
    const int64_t s0 = home.begin + first;
    int64_t hi[kEvictSlots], lo[kEvictSlots];
    uint32_t m = occupied_ranks<kRank>(p, s0, home.end, hi, lo);
    for (;;) {
      Victim mine = kNoVictim;
#pragma unroll
      for (int k = 0; k < kEvictSlots; ++k) {
        const Victim c{hi[k], lo[k], s0 + k};
        if (((m >> k) & 1u) != 0 && before(c, mine)) mine = c;
      }
      const Victim best = tile_best(tile, mine);
      if (best.g == INT64_MAX) return -1;
      uint32_t word = 0;
      if (rank == 0) word = claim_word(p.protect_bits, best.g);
      word = tile.shfl(word, 0);
      if (((word >> (best.g & 31)) & 1u) == 0) return best.g;
      const int64_t word_slot = best.g & ~int64_t{31};
#pragma unroll
      for (int k = 0; k < kEvictSlots; ++k) {
        const int64_t d = s0 + k - word_slot;
        if (d >= 0 && d < 32 && ((word >> d) & 1u) != 0) m &= ~(1u << k);
      }
    }
  }
  for (;;) {
    Victim best = kNoVictim;
    for (int64_t base = home.begin; base < home.end; base += kStep) {
      const Victim c = read_candidates<kRank>(p, base + first, home.end);
      if (before(c, best)) best = c;
    }
    best = tile_best(tile, best);
    if (best.g == INT64_MAX) return -1;
    int won = 0;
    if (rank == 0) won = claim(p.protect_bits, best.g) ? 1 : 0;
    if (tile.shfl(won, 0) != 0) return best.g;
  }
}

/**
 * @brief Pass 2: a tile of kEvictTile threads per pending leader, grid-stride over the pending
 * list (its length is read here, on the device: no synchronisation; each entry carries the key
 * and its table, so a tile goes from the entry straight to the bucket). A leader of an evicting
 * table takes a victim; otherwise (NO_EVICTION, or nothing left to evict) slot -1. Then every
 * thread writes digests of the placed list (grid-stride), as many as fit the grid at once.
 */
__global__ void __launch_bounds__(kBlockThreads, 3) evict_kernel(UpsertParams p) {
  __shared__ unsigned int block_evicted;  // insert_and_evict: this block's victims
  if (threadIdx.x == 0) block_evicted = 0;
  __syncthreads();
  const auto tile = cg::tiled_partition<kEvictTile>(cg::this_thread_block());
  const int64_t tiles = static_cast<int64_t>(gridDim.x) * (kBlockThreads / kEvictTile);
  const int64_t count = *p.pending_count;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kEvictTile;
       w < count; w += tiles) {
    const longlong2 entry = reinterpret_cast<const longlong2*>(p.pending)[w];
    const int64_t key = entry.x;
    const int64_t i = entry.y & 0xffffffffll;
    const int64_t t = entry.y >> 32;
    KeyHome home;
    key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home);  // pass 1 placed it
    const int64_t policy = p.policies[t];
    const bool use_fn = p.has_fn != nullptr && p.has_fn[t] != 0;
    int64_t g = -1;
    const ScanView view{p.digests, p.scores, p.fn_scores, p.pins, p.protect_bits};
    if (!policy_can_evict(policy)) {
    } else if (use_fn) {
      g = claim_victim<RankBy::kFn>(tile, view, home);
    } else if (policy == kCompound) {
      g = claim_victim<RankBy::kPair>(tile, view, home);
    } else {  // TIMESTAMP, STEP, LFU, CUSTOMIZED
      g = claim_victim<RankBy::kWord0>(tile, view, home);
    }
    if (tile.thread_rank() != 0) continue;
    p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
    p.out_flag[i] = g >= 0;
    if (p.mode == UpsertMode::kInsertAndEvict) p.ev_flag[w] = g >= 0;
    if (g < 0) continue;
    if (p.mode == UpsertMode::kInsertAndEvict) {  // reported at the entry's place in the list
      int64_t old[2];  // the words it had: unchanged since the scan, only the claimer writes
      load_words(p.scores, g, old);
      p.ev_keys[w] = p.table_keys[g];
      p.ev_slots[w] = g - home.layout.offset;
      p.ev_scores[2 * w] = old[0];
      p.ev_scores[2 * w + 1] = old[1];
      p.ev_table_ids[w] = t;
      atomicAdd(&block_evicted, 1u);
    }
    int64_t nw[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
    touched_words(p, i, policy, p.now[t], nw);
    store_words(p.scores, g, nw);
    p.table_keys[g] = key;
    p.digests[g] = home.digest;
  }
  // the digests of the leaders pass 1 placed in empty slots: findable from here on
  const int64_t placed = *p.placed_count;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x; j < placed;
       j += static_cast<int64_t>(gridDim.x) * kBlockThreads) {
    const unsigned long long e = p.placed[j];
    p.digests[e & kPlacedSlotMask] = static_cast<uint8_t>(e >> 56);
  }
  __syncthreads();  // every thread leaves the loop: the count is one atomicAdd per block
  if (threadIdx.x == 0 && block_evicted != 0) {
    atomicAdd(p.evicted_count, static_cast<int>(block_evicted));
  }
}

/** @brief Follower i takes its leader's answer and touches its slot (input words: one wins). */
__device__ __forceinline__ void finish_follower(const UpsertParams& p, int64_t i, int64_t s) {
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
    touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g, touch_count(p.counts, i));
  }
}

/**
 * @brief Pass 3, grid-stride over the followers pass 1 listed (none when the keys are distinct):
 * each takes its leader's answer, final after pass 2, and touches the leader's slot.
 */
__global__ void __launch_bounds__(kBlockThreads) finish_kernel(UpsertParams p) {
  const int64_t count = *p.follower_count;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.x) * kBlockThreads) {
    const int64_t i = p.followers[j];
    finish_follower(p, i, p.out_slots[i]);
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
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, evict_kernel, kBlockThreads, 0));
    per_sm = std::max(blocks, 1);
  }
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(
      std::min<int64_t>(blocks_for(n, kBlockThreads / kEvictTile), int64_t{sms} * per_sm));
}

/** @brief Pass 1's launch (a tile per key). */
inline void launch_present(const UpsertParams& p, cudaStream_t stream) {
  present_kernel<<<blocks_for(p.n, kBlockThreads / kPresentTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Pass 2's launch (grid-stride over the pending list, whose length it reads itself). */
inline void launch_evict(const UpsertParams& p, cudaStream_t stream) {
  evict_kernel<<<evict_grid(p.n), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Pass 3's launch (grid-stride over the followers, four blocks per SM at most). */
inline void launch_finish(const UpsertParams& p, cudaStream_t stream) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::min<int64_t>(blocks_for(p.n, kBlockThreads), int64_t{sms} * 4);
  finish_kernel<<<blocks, kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/**
 * @brief What the key-parallel engine accepts: an inserting mode (erase and insert_at stay on the
 * bucket-ordered engine) and at most 2^31-1 keys (pending entries carry an int32 index).
 */
inline void check_upsert_parallel(const UpsertParams& p) {
  DEMB_CHECK(p.mode == UpsertMode::kInsert || p.mode == UpsertMode::kFindOrInsert ||
                 p.mode == UpsertMode::kInsertAndEvict,
             "dynamicemb table (CUDA): the key-parallel engine only inserts");
  DEMB_CHECK_VALUE(p.n <= INT32_MAX, "dynamicemb table (CUDA): at most 2^31-1 keys per call, got ",
                   p.n, "; split the call");
}

/**
 * @brief Selector: present, evict, finish, one after the other on `stream`. `p.protect_bits` must
 * be zeroed, `p.pending_count` zeroed, `p.pending` hold 2n words, `p.dedup` filled with -1
 * (dedup_words(n) words); `p.now` set (the ops resolve it for every inserting call).
 */
inline void select_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  check_upsert_parallel(p);
  launch_present(p, stream);
  launch_evict(p, stream);
  launch_finish(p, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
