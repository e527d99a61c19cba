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
 *
 * Cache use: a lookup of 1M keys in a 64M-slot table moves ~0.3 GB of random sectors, more than
 * the L2 holds, so everything that is read or written once per key (the input keys and table ids,
 * the matched key and words, the outputs) goes through the L2 evict-first (__ldcs / __stcs) and
 * the digest lines, which every probe of a bucket reads again, keep the L2 for themselves.
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
// Blocks per SM find is built for (__launch_bounds__): 8 x 256 threads fill an SM, so the compiler
// keeps the plain lookup within 32 registers (no spills) and 512 keys per SM are in flight instead
// of 384 at its natural 40; the touching lookup keeps its natural 48 registers (5 blocks: fewer
// spill).
template <bool kUpdate>
constexpr int kFindBlocksPerSm = kUpdate ? 5 : 8;

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
 * @brief The lookups' probe of [home.begin, home.end) for `key` by a tile of kFindTile threads:
 * tile_probe's rule (digests first, the full key only where a digest matches), with two changes
 * that only a read-only probe can make. Load v of thread r reads the 16 digests at
 * base + 16 * (v * kFindTile + r), so each load instruction of the tile reads 64 contiguous bytes
 * and the two ask for different 32-byte sectors (tile_probe's thread-contiguous layout asks for
 * every sector twice, which its lowest-empty search needs and a lookup does not). And a digest
 * match loads the key (and with `scores` its words) evict-first: they are read once per key, so
 * they must not push the digest lines out of the L2. Every thread of the tile gets the answer.
 */
template <typename Tile>
__device__ __forceinline__ Probe find_probe(const Tile& tile, const int64_t* table_keys,
                                            const uint8_t* digests, int64_t key,
                                            const KeyHome& home, const int64_t* scores) {
  const int rank = tile.thread_rank();
  constexpr int64_t kStep = 16 * kFindVec * kFindTile;
  for (int64_t base = home.begin; base < home.end; base += kStep) {
    uint32_t m[kFindVec];
#pragma unroll
    for (int v = 0; v < kFindVec; ++v) {
      m[v] = 0;
      const int64_t g = base + 16 * (v * kFindTile + rank);
      uint32_t empty;
      if (g < home.end) scan16(digests, g, home.end, home.digest, &m[v], &empty);
    }
    int64_t hit = -1;
    longlong2 words = make_longlong2(0, 0);
#pragma unroll
    for (int v = 0; v < kFindVec; ++v) {
      while (m[v] && hit < 0) {
        const int64_t g = base + 16 * (v * kFindTile + rank) + __ffs(m[v]) - 1;
        m[v] &= m[v] - 1;
        if (scores != nullptr) words = __ldcs(reinterpret_cast<const longlong2*>(scores + 2 * g));
        if (__ldcs(reinterpret_cast<const long long*>(table_keys + g)) == key) hit = g;
      }
    }
    const unsigned hits = tile.ballot(hit >= 0);
    if (hits) {
      const int src = __ffs(hits) - 1;
      return Probe{tile.shfl(hit, src), -1, tile.shfl(words.x, src), tile.shfl(words.y, src)};
    }
  }
  return Probe{-1, -1, 0, 0};
}

/**
 * @brief One tile per key. Without kUpdate the probe loads the words beside the key (see
 * find_probe), so a found key's words cost no extra round trip; with it they are read back after
 * every touch of the call (read_scores_kernel).
 */
template <bool kUpdate>
__global__ void __launch_bounds__(kBlockThreads, kFindBlocksPerSm<kUpdate>)
    find_kernel(FindParams p) {
  auto tile = cg::tiled_partition<kFindTile>(cg::this_thread_block());
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kFindTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = __ldcs(reinterpret_cast<const long long*>(p.keys + i));
  const int64_t t = __ldcs(reinterpret_cast<const long long*>(p.table_ids + i));
  KeyHome home;
  Probe r{-1, -1, 0, 0};
  if (key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    r = find_probe(tile, p.table_keys, p.digests, key, home, kUpdate ? nullptr : p.scores);
  }
  if (tile.thread_rank() != 0) return;
  const int64_t g = r.hit;
  __stcs(reinterpret_cast<long long*>(p.out_slots + i),
         static_cast<long long>(g >= 0 ? g - home.layout.offset : -1));
  __stcs(reinterpret_cast<unsigned char*>(p.out_found + i), static_cast<unsigned char>(g >= 0));
  if (kUpdate) {
    p.out_global[i] = g;
    if (g >= 0) touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g);
    return;
  }
  __stcs(reinterpret_cast<longlong2*>(p.out_scores + 2 * i), make_longlong2(r.w0, r.w1));  // 0s: missing
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
