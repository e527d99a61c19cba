/**
 * @file table_find.cuh
 * @brief find on CUDA: params struct, kernels, launcher, selector (STYLE rule 7).
 *
 * A lookup never writes a key or digest, so keys are probed fully in parallel: a tile of 4 threads
 * per key, each thread reading 32 digests with two 16-byte loads (128 slots per step, one default
 * bucket), comparing full keys only where the digest matches. With update_score the found slots'
 * words are touched with atomics, which commute: a key that occurs c times in the call gains c
 * counts whatever the order, so the result is deterministic and equals the CPU kernel's. The words
 * reported are read by a second kernel, after every touch of the call.
 */
#pragma once

#include <cooperative_groups.h>

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

// Threads per key and 16-byte loads per thread: 4 x 2 x 16 digests = one 128-slot bucket per step,
// with 64 keys in flight per 256-thread block (a lookup is a chain of dependent loads, so keys in
// flight, not bandwidth, bound it).
constexpr int kFindTile = 4;
constexpr int kFindVec = 2;

struct FindParams {
  const int64_t* keys;
  const int64_t* table_ids;
  int64_t n;
  const int64_t* table_keys;
  const uint8_t* digests;
  int64_t* scores;  // (total_slots, 2); written only with update_score
  const int64_t* slot_offsets;
  const int64_t* bucket_caps;
  const int64_t* policies;
  int64_t num_tables;
  const int64_t* now;  // (T,) resolved score of the call; only with update_score
  bool update_score;
  int64_t* out_slots;   // (n,) local slot or -1
  bool* out_found;      // (n,)
  int64_t* out_scores;  // (n, 2) internal order
  int64_t* out_global;  // (n,) global slot or -1, for the score read-back; only with update_score
};

/**
 * @brief The concurrent form of apply_touch (score_policy.h) for one occurrence of a found key:
 * counts grow with atomicAdd; time / step / custom words are the same value for every occurrence
 * of the call, so plain stores agree. Keep in step with apply_touch.
 */
__device__ __forceinline__ void touch_atomic(int64_t policy, int64_t now, int64_t* words) {
  if (policy_keeps_words(policy)) return;
  switch (policy) {
    case kLfu:
      atomicAdd(reinterpret_cast<unsigned long long*>(words), 1ull);
      words[1] = 0;
      break;
    case kCompound:
      atomicAdd(reinterpret_cast<unsigned long long*>(words), 1ull);
      words[1] = now;
      break;
    default:
      words[0] = now;
      words[1] = 0;
      break;
  }
}

/**
 * @brief One tile per key. Without kUpdate the probe loads the words beside the key (see
 * tile_probe), so a found key's words cost no extra round trip; with it they are read back after
 * every touch of the call (read_scores_kernel).
 */
template <bool kUpdate>
__global__ void __launch_bounds__(kBlockThreads) find_kernel(FindParams p) {
  auto tile = cg::tiled_partition<kFindTile>(cg::this_thread_block());
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kFindTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = p.keys[i];
  const int64_t t = p.table_ids[i];
  KeyHome home;
  Probe r{-1, -1, 0, 0};
  if (key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    r = tile_probe<kFindVec>(tile, p.table_keys, p.digests, key, home, false,
                             kUpdate ? nullptr : p.scores);
  }
  if (tile.thread_rank() != 0) return;
  const int64_t g = r.hit;
  p.out_slots[i] = g >= 0 ? g - home.layout.offset : -1;
  p.out_found[i] = g >= 0;
  if (kUpdate) {
    p.out_global[i] = g;
    if (g >= 0) touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g);
    return;
  }
  *reinterpret_cast<longlong2*>(p.out_scores + 2 * i) = make_longlong2(r.w0, r.w1);  // 0s: missing
}

/** @brief After the touches: the words each found key's slot now holds (zeros when missing). */
__global__ void __launch_bounds__(kBlockThreads)
    read_scores_kernel(const int64_t* __restrict__ global_slots, int64_t n,
                       const int64_t* __restrict__ scores, int64_t* __restrict__ out_scores) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (i >= n) return;
  const int64_t g = global_slots[i];
  int64_t w[2] = {0, 0};
  if (g >= 0) load_words(scores, g, w);
  out_scores[2 * i] = w[0];
  out_scores[2 * i + 1] = w[1];
}

/** @brief Launcher: one tile per key, then (with update_score) the score read-back. */
inline void launch_find(const FindParams& p, cudaStream_t stream) {
  const int64_t keys_per_block = kBlockThreads / kFindTile;
  if (p.update_score) {
    find_kernel<true><<<blocks_for(p.n, keys_per_block), kBlockThreads, 0, stream>>>(p);
  } else {
    find_kernel<false><<<blocks_for(p.n, keys_per_block), kBlockThreads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.update_score) {
    read_scores_kernel<<<blocks_for(p.n, kBlockThreads), kBlockThreads, 0, stream>>>(
        p.out_global, p.n, p.scores, p.out_scores);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

/** @brief Selector: find has one variant (the tile probe handles every bucket width). */
inline void select_find(const FindParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  launch_find(p, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
