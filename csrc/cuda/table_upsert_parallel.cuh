/**
 * @file table_upsert_parallel.cuh
 * @brief The key-parallel engine behind insert, find_or_insert and insert_and_evict on CUDA, run
 * when the ops get deterministic=false (DEMB_DETERMINISM_MODE=0; the bucket-ordered engine of
 * table_upsert.cuh stays the default until this one has passed the whole GPU suite).
 * Params (UpsertParams, shared), kernels, launcher, selector (STYLE rule 7).
 *
 * Two kernels, one cooperative group (tile) per key in each, no sort:
 *  1. present pass (4 threads per key, lock-free, like find): a key already in its bucket keeps its
 *     slot, is touched with atomics and its slot is protected. The whole pass ends before any new
 *     key is placed, so a new key can never evict a key of the same call (contract rule 2).
 *  2. placing pass (one warp per key left over): the tile takes its bucket's spin lock, probes again
 *     (a duplicate of the key may have been placed by another tile meanwhile: then it shares that
 *     slot), else takes the lowest empty slot, else the victim: the occupied slot of lowest rank
 *     that is neither protected (written in this call) nor pinned, found by a warp-wide reduction
 *     over the bucket's score words (32 threads x 4 slots for a 128-slot bucket). Under the lock
 *     every read goes through L2 (__ldcg), and the lock is released after a fence, so the next
 *     holder sees the slot written.
 *
 * What this keeps of the contract whatever the schedule: each (table, key) is present at most once
 * (placements of one bucket are serialised by its lock, and a placement re-probes first); every
 * returned slot holds its key when the call returns (written slots are protected); present keys keep
 * their slots; each victim is evicted once (it is protected once taken) and reported with the words
 * it had; the victims of a bucket are exactly the k lowest-ranked unprotected, unpinned slots it had
 * when the call began (each placement takes the lowest that is left), and k is the deterministic
 * engine's. What depends on the schedule: which new key lands in which of those slots, and, when a
 * bucket gets more new keys than it can take, which of them get in. Per-bucket locks are one 32-bit
 * word per 16 slots, zeroed per call.
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
constexpr int kPlaceTile = 32;   // threads per key in the placing pass: a warp per victim scan
constexpr int kPlaceVec = 1;     // 32 x 16 = 512 digests per step
constexpr int kBlocksPerSm = 8;  // grid of the grid-stride kernels: enough to fill every SM

/** @brief Index of the spin lock of a bucket that starts at global slot `begin`. */
__device__ __forceinline__ int64_t lock_index(int64_t begin) { return begin >> 4; }

/** @brief Words of the lock array for `total_slots` slots (buckets start 16-aligned, except a
 * single-bucket table's, which may share its lock word with a neighbour: harmless, one lock is
 * held at a time). */
inline int64_t lock_words(int64_t total_slots) { return (total_slots >> 4) + 1; }

/**
 * @brief Pass 1: a tile of kPresentTile threads per key, grid-stride. Present keys: slot, touch
 * (atomics: occurrences commute), protect. Absent: out_slots = kPending for pass 2.
 */
__global__ void __launch_bounds__(kBlockThreads) present_kernel(UpsertParams p) {
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
      continue;
    }
    const int64_t g =
        tile_probe<kPresentVec>(tile, p.table_keys, p.digests, key, home, false).hit;
    if (tile.thread_rank() != 0) continue;
    if (g < 0) {
      p.out_slots[i] = kPending;
      continue;
    }
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
}

/**
 * @brief The bucket's victim for a new key, read through L2 under the bucket lock: the occupied
 * slot of lowest rank (then lowest slot) that is neither protected nor pinned, or -1. Every
 * thread of the warp scans a strided share, then the warp reduces.
 */
template <typename Tile>
__device__ __forceinline__ int64_t locked_victim(const Tile& tile, const UpsertParams& p,
                                                 const KeyHome& home, int64_t policy,
                                                 bool use_fn) {
  Candidate best{-1, 0, 0, 0.0};
  for (int64_t g = home.begin + tile.thread_rank(); g < home.end; g += kPlaceTile) {
    if (is_protected(p.protect_bits, g)) continue;
    if (p.pins != nullptr && p.pins[g] > 0) continue;
    if (__ldcg(p.digests + g) == 0) continue;
    Candidate c{g, 0, 0, use_fn ? p.fn_scores[g] : 0.0};
    if (!use_fn) {
      int64_t w[2];
      load_words_cg(p.scores, g, w);
      c.w0 = w[0];
      c.w1 = w[1];
    }
    if (evicts_before(c, best, policy, use_fn)) best = c;
  }
  for (int o = kPlaceTile / 2; o > 0; o >>= 1) {
    Candidate other;
    other.g = tile.shfl_xor(best.g, o);
    other.w0 = tile.shfl_xor(best.w0, o);
    other.w1 = tile.shfl_xor(best.w1, o);
    other.f = tile.shfl_xor(best.f, o);
    if (evicts_before(other, best, policy, use_fn)) best = other;
  }
  return best.g;
}

/**
 * @brief Pass 2: one warp per key that pass 1 left pending, grid-stride; placements of one bucket
 * under its lock. Size changes are summed per block in shared memory (first tables) and added
 * once per block at the end.
 */
__global__ void __launch_bounds__(kBlockThreads) place_kernel(UpsertParams p) {
  __shared__ unsigned long long block_delta[kSharedSizeTables];
  if (threadIdx.x < kSharedSizeTables) block_delta[threadIdx.x] = 0;
  __syncthreads();
  using Tile = cg::thread_block_tile<kPlaceTile>;
  const Tile tile = cg::tiled_partition<kPlaceTile>(cg::this_thread_block());
  const int64_t tiles = static_cast<int64_t>(gridDim.x) * (kBlockThreads / kPlaceTile);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kPlaceTile;
       i < p.n; i += tiles) {
    if (p.out_slots[i] != kPending) continue;  // the same answer for the whole tile
    const int64_t key = p.keys[i];
    const int64_t t = p.table_ids[i];
    KeyHome home;
    key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home);  // true: pass 1 said so
    const int64_t policy = p.policies[t];
    const bool use_fn = p.has_fn != nullptr && p.has_fn[t] != 0;
    unsigned int* lock = p.bucket_locks + lock_index(home.begin);
    if (tile.thread_rank() == 0) {
      while (atomicCAS(lock, 0u, 1u) != 0u) __nanosleep(64);
      __threadfence();
    }
    tile.sync();
    const Probe probe =
        tile_probe<kPlaceVec, Tile, true>(tile, p.table_keys, p.digests, key, home, true);
    int64_t g = probe.hit >= 0 ? probe.hit : probe.empty;
    const bool again = probe.hit >= 0;  // a duplicate of this key placed it in this call
    const bool was_empty = !again && g >= 0;
    bool evicting = false;
    if (g < 0 && policy_can_evict(policy)) {
      g = locked_victim(tile, p, home, policy, use_fn);
      evicting = g >= 0;
    }
    if (tile.thread_rank() == 0) {
      p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
      p.out_flag[i] = g >= 0;
      if (g >= 0) {
        int64_t w[2] = {0, 0};  // a new key starts from {0, 0} (score_policy.h)
        if (again) load_words_cg(p.scores, g, w);
        if (evicting && p.mode == UpsertMode::kInsertAndEvict) {
          int64_t old[2];
          load_words_cg(p.scores, g, old);
          p.ev_flag[i] = true;
          p.ev_keys[i] = __ldcg(p.table_keys + g);
          p.ev_slots[i] = g - home.layout.offset;
          p.ev_scores[2 * i] = old[0];
          p.ev_scores[2 * i + 1] = old[1];
        }
        touched_words(p, i, policy, p.now[t], w);
        store_words(p.scores, g, w);
        p.table_keys[g] = key;
        p.digests[g] = home.digest;
        protect(p.protect_bits, g);
        if (was_empty) {
          if (t < kSharedSizeTables) {
            atomicAdd(&block_delta[t], 1ull);
          } else {
            atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + t), 1ull);
          }
        }
      }
      __threadfence();
      atomicExch(lock, 0u);
    }
    tile.sync();
  }
  __syncthreads();
  if (threadIdx.x < kSharedSizeTables && threadIdx.x < p.num_tables &&
      block_delta[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.sizes + threadIdx.x),
              block_delta[threadIdx.x]);
  }
}

/** @brief Blocks of a grid-stride kernel: enough to fill the GPU, never more than the work. */
inline int grid_for(int64_t n, int64_t per_block) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::min<int64_t>(blocks_for(n, per_block), int64_t{sms} * kBlocksPerSm));
}

/**
 * @brief Launcher: the present pass, then the placing pass. `p.bucket_locks` and
 * `p.protect_bits` must be zeroed; `p.now` set (the ops resolve it for every inserting call).
 */
inline void launch_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  present_kernel<<<grid_for(p.n, kBlockThreads / kPresentTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  place_kernel<<<grid_for(p.n, kBlockThreads / kPlaceTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Selector: the key-parallel engine has one variant (kInsert / kFindOrInsert /
 * kInsertAndEvict; erase and insert_at stay on the bucket-ordered engine). */
inline void select_upsert_parallel(const UpsertParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  DEMB_CHECK(p.mode == UpsertMode::kInsert || p.mode == UpsertMode::kFindOrInsert ||
                 p.mode == UpsertMode::kInsertAndEvict,
             "dynamicemb table (CUDA): the key-parallel engine only inserts");
  launch_upsert_parallel(p, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
