/**
 * @file table_find.cuh
 * @brief find on CUDA: params struct, kernels, launcher, selector (STYLE rule 7).
 *
 * A lookup never writes a key or digest, so keys are probed fully in parallel: a tile of 2 threads
 * per key, each thread reading 64 digests with four 16-byte loads (128 slots per step, one default
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

#include <type_traits>

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

/**
 * @brief The shape of a lookup kernel: kTile threads per key, each with kVec 16-byte digest loads
 * (kTile x kVec x 16 = 128 digests, one default bucket, per step), blocks of kThreads threads,
 * and kBlocks blocks per SM for __launch_bounds__ (which sets the register budget). A lookup is a
 * chain of dependent loads, so the keys in flight per SM (2048 / kTile at full occupancy), not the
 * bandwidth, bound it.
 */
template <int kTile_, int kVec_, int kThreads_, int kBlocks_>
struct LookupShape {
  static constexpr int kTile = kTile_;
  static constexpr int kVec = kVec_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kBlocks = kBlocks_;
  static constexpr int kKeysPerBlock = kThreads / kTile;
  static_assert(kTile * kVec * 16 == 128, "a probe step covers one 128-slot bucket");
};

// find's shapes. The plain lookup: 2 threads per key in blocks of 64, 32 per SM, so 1,024 keys
// per SM are in flight at 32 registers (8 bytes spilled); 6% faster on the H200 than 4 threads per
// key in blocks of 256 (512 keys per SM). Small blocks retire as soon as their 32 keys are done, so an SM is not held
// by a block waiting for its slowest key. The touching lookup keeps 4 threads per key at its
// natural 48 registers (5 blocks of 256: fewer spill).
template <bool kUpdate>
using FindShape =
    std::conditional_t<kUpdate, LookupShape<4, 2, kBlockThreads, 5>, LookupShape<2, 4, 64, 32>>;

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
  const int64_t* counts;  // (n,) accesses each key's touch counts (touch_count), or null: 1 each
};

/**
 * @brief The concurrent form of apply_touch (score_policy.h) for one occurrence of a found key,
 * counting `count` accesses (touch_count): counts grow with atomicAdd; time / step / custom words
 * are the same value for every occurrence of the call, so plain stores agree. Keep in step with
 * apply_touch.
 */
__device__ __forceinline__ void touch_atomic(int64_t policy, int64_t now, int64_t* words,
                                             int64_t count) {
  if (policy_keeps_words(policy)) return;
  const unsigned long long add = static_cast<unsigned long long>(count);
  switch (policy) {
    case kLfu:
      atomicAdd(reinterpret_cast<unsigned long long*>(words), add);
      words[1] = 0;
      break;
    case kCompound:
      atomicAdd(reinterpret_cast<unsigned long long*>(words), add);
      words[1] = now;
      break;
    default:
      words[0] = now;
      words[1] = 0;
      break;
  }
}

/**
 * @brief The lookups' probe of [home.begin, home.end) for `key` by a tile of kTile threads with
 * kVec 16-byte loads each: tile_probe's rule (digests first, the full key only where a digest
 * matches), with two changes that only a read-only probe can make. Load v of thread r reads the 16
 * digests at base + 16 * (v * kTile + r), so each load instruction of the tile reads kTile * 16
 * contiguous bytes and the loads ask for different 32-byte sectors (tile_probe's
 * thread-contiguous layout asks for every sector twice, which its lowest-empty search needs and a
 * lookup does not). And a digest
 * match loads the key (and with `scores` its words) evict-first: they are read once per key, so
 * they must not push the digest lines out of the L2. Every thread of the tile gets the answer.
 */
template <int kTile, int kVec, typename Tile>
__device__ __forceinline__ Probe find_probe(const Tile& tile, const int64_t* table_keys,
                                            const uint8_t* digests, int64_t key,
                                            const KeyHome& home, const int64_t* scores) {
  const int rank = tile.thread_rank();
  constexpr int64_t kStep = 16 * kVec * kTile;
  for (int64_t base = home.begin; base < home.end; base += kStep) {
    uint32_t m[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      m[v] = 0;
      const int64_t g = base + 16 * (v * kTile + rank);
      uint32_t empty;
      if (g < home.end) scan16(digests, g, home.end, home.digest, &m[v], &empty);
    }
    int64_t hit = -1;
    longlong2 words = make_longlong2(0, 0);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      while (m[v] && hit < 0) {
        const int64_t g = base + 16 * (v * kTile + rank) + __ffs(m[v]) - 1;
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
template <bool kUpdate, typename S>
__global__ void __launch_bounds__(S::kThreads, S::kBlocks) find_kernel(FindParams p) {
  auto tile = cg::tiled_partition<S::kTile>(cg::this_thread_block());
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * S::kThreads + threadIdx.x) / S::kTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = __ldcs(reinterpret_cast<const long long*>(p.keys + i));
  const int64_t t = __ldcs(reinterpret_cast<const long long*>(p.table_ids + i));
  KeyHome home;
  Probe r{-1, -1, 0, 0};
  if (key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    r = find_probe<S::kTile, S::kVec>(tile, p.table_keys, p.digests, key, home,
                                      kUpdate ? nullptr : p.scores);
  }
  if (tile.thread_rank() != 0) return;
  const int64_t g = r.hit;
  __stcs(reinterpret_cast<long long*>(p.out_slots + i),
         static_cast<long long>(g >= 0 ? g - home.layout.offset : -1));
  __stcs(reinterpret_cast<unsigned char*>(p.out_found + i), static_cast<unsigned char>(g >= 0));
  if (kUpdate) {
    p.out_global[i] = g;
    if (g >= 0) touch_atomic(p.policies[t], p.now[t], p.scores + 2 * g, touch_count(p.counts, i));
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

/** @brief One tile of S::kTile threads per key, blocks of S::kThreads. */
template <bool kUpdate, typename S>
void launch_find_shape(const FindParams& p, cudaStream_t stream) {
  find_kernel<kUpdate, S>
      <<<blocks_for(p.n, S::kKeysPerBlock), S::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/** @brief Launcher: one tile per key, then (with update_score) the score read-back. */
inline void launch_find(const FindParams& p, cudaStream_t stream) {
  if (p.update_score) {
    launch_find_shape<true, FindShape<true>>(p, stream);
    read_scores_kernel<<<blocks_for(p.n, kBlockThreads), kBlockThreads, 0, stream>>>(
        p.out_global, p.n, p.scores, p.out_scores);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  launch_find_shape<false, FindShape<false>>(p, stream);
}

/** @brief Selector: find has one variant (the tile probe handles every bucket width). */
inline void select_find(const FindParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  launch_find(p, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
