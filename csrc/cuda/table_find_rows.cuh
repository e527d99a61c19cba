/**
 * @file table_find_rows.cuh
 * @brief find_rows on CUDA (find and the found keys' rows in one kernel): params struct, kernels,
 * launchers, selector (STYLE rule 7).
 *
 * find then gather_rows runs two kernels one after the other: the probes (a chain of dependent
 * loads per key, latency-bound) and then the row copy (bandwidth-bound). Here one kernel probes
 * and copies, so while some warps copy, others probe. Two kernels, by row width:
 *
 * - Rows of whole aligned 16-byte vectors (every fp32 width that is a multiple of 4), the staged
 *   kernel: one thread per key, whose 128 digests a step reach shared memory by asynchronous copies
 *   (cp.async) that the warp shares out (4 whole lines a copy instruction), so the loads in flight
 *   hold no registers and 1,536 keys per SM are probed at once (4 threads a key held 384). Then the warp copies its 32 keys' rows, one contiguous span of the
 *   output, through the same shared memory, again with asynchronous loads: up to 8 vectors a lane
 *   in flight at 40 registers. On the H200 this is 1.00x-1.05x the tile kernel at dim 64 and
 *   1.05x-1.30x at dims 8 / 32 (docs/benchmarks.md, issue 14, helper find, third round).
 * - Other rows, the tile kernel: a tile of 4 threads probes a key (as find) and copies its row as
 *   soon as it has the slot, the lanes taking the row's vectors in turn, kRowsUnroll loads each
 *   before the first store.
 *
 * The rows are read and written evict-first (__ldcs / __stcs, or an evict-first L2 policy on the
 * asynchronous copies), like everything a lookup touches once (table_find.cuh): at dim 64 they are
 * ~0.5 GB per 1M keys, which would otherwise flush the digest lines from the L2 on every call.
 */
#pragma once

#include <cooperative_groups.h>

#include <atomic>

#include "table_common.cuh"
#include "table_find.cuh"
#include "table_rows.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

constexpr int kRowsUnroll = 4;  // the tile kernel: vectors a lane loads before it stores
// The tile kernel: find's probe tile, 6 blocks of 256 per SM (at most 40 registers, 75% occupancy).
using FindRowsShape = LookupShape<4, 2, kBlockThreads, 6>;
// The staged kernel: one thread a key, 24 blocks of 64 per SM (40 registers, 8 KB of shared memory
// a block: each thread's 128 digests, and later 8 row vectors a lane).
using FindRowsStagedShape = LookupShape<1, 8, 64, 24>;
constexpr int kStagedUnroll = 8;  // 16-byte vectors a lane has in flight in the staged row copy

struct FindRowsParams {
  const int64_t* keys;
  const int64_t* table_ids;
  int64_t n;
  const int64_t* table_keys;
  const uint8_t* digests;
  const int64_t* slot_offsets;
  const int64_t* bucket_caps;
  int64_t num_tables;
  const char* values;  // (capacity, width) rows by local slot
  int64_t capacity;    // rows of values: a slot at or past it reads zeros
  int vecs_per_row;    // row bytes / vector bytes
  int64_t* out_slots;  // (n,) local slot or -1
  bool* out_found;     // (n,)
  char* out_rows;      // (n, width)
};

/** @brief An L2 policy that marks lines evict-first (what __ldcs asks for), for cp.async. */
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

/** @brief 16 bytes global -> shared without registers (sm_80+; a plain copy before). */
__device__ __forceinline__ void copy16_async(void* smem, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(src);
#endif
}

/** @brief copy16_async under an L2 policy (evict_first_policy for the rows). */
__device__ __forceinline__ void copy16_async(void* smem, const void* src, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
               "l"(src), "l"(policy)
               : "memory");
#else
  *static_cast<uint4*>(smem) = __ldcs(static_cast<const uint4*>(src));
#endif
}

/** @brief Waits for this thread's asynchronous copies (their data is then visible to it). */
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
}

/**
 * @brief The staged kernel's probe, one key a lane, with the warp's digest copies shared out: in a
 * step, copy v of lane l fetches chunk l & 7 of the 128-digest line of lane 4 v + (l >> 3), so each
 * copy instruction of the warp reads 4 whole 128-byte lines (one request a line) instead of 16
 * bytes of 32 different lines (the H200 A/B of docs/benchmarks.md, session 12: 12-16% less time
 * at dim 64 than a lane copying its own line). Line k lands in `stage` at 8 k, chunk c at
 * ((c + k) & 7) so that a warp reading chunk v hits every bank once per 8 lanes; each lane then
 * scans its own line. A bucket that is not whole aligned 16-byte chunks is scanned from global
 * memory by its lane (scan16); wider buckets take more steps, the warp stepping until every lane
 * is done. Candidates in slot order; a digest match loads the key evict-first, as find_probe does.
 */
class WarpStagedProbe {
 public:
  /** @brief `live`: the lane has a key whose home is valid (the others only help copy). */
  __device__ __forceinline__ WarpStagedProbe(const uint8_t* digests, bool live, const KeyHome& home)
      : aligned_(live && ((reinterpret_cast<uintptr_t>(digests + home.begin) |
                           (home.end - home.begin)) &
                          15) == 0),
        base_(live ? home.begin : -1),
        end_(live ? home.end : 0),
        digest_(live ? home.digest : 0) {}

  /** @brief The slot holding `key`, or -1. Every lane of the warp calls it (shuffles). */
  __device__ __forceinline__ int64_t run(uint4* stage, const int64_t* table_keys,
                                         const uint8_t* digests, int64_t key) {
    while (__any_sync(0xffffffffu, base_ >= 0)) {
      issue(stage, digests);
      wait_async_copies();
      __syncwarp();  // the lines other lanes copied are visible after their waits and this barrier
      scan(stage, table_keys, digests, key);
      __syncwarp();  // every lane has read its line before the next step overwrites the stage
    }
    return hit_;
  }

 private:
  /** @brief The warp's asynchronous copies of every lane's current step. */
  __device__ __forceinline__ void issue(uint4* stage, const uint8_t* digests) const {
    const int lane = threadIdx.x & 31;
    const int c = lane & 7;  // the chunk this lane copies for others
    const bool coop = base_ >= 0 && aligned_;
    const auto src = reinterpret_cast<unsigned long long>(coop ? digests + base_ : digests);
    const int len = coop ? static_cast<int>(end_ - base_ < 128 ? end_ - base_ : 128) : 0;
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      const int k = 4 * v + (lane >> 3);
      const auto s = __shfl_sync(0xffffffffu, src, k);
      const int l = __shfl_sync(0xffffffffu, len, k);
      if (16 * c < l) {
        copy16_async(stage + 8 * k + ((c + k) & 7), reinterpret_cast<const uint8_t*>(s) + 16 * c);
      }
    }
  }

  /** @brief This lane's scan of its step and its key compares. */
  __device__ __forceinline__ void scan(const uint4* stage, const int64_t* table_keys,
                                       const uint8_t* digests, int64_t key) {
    if (base_ < 0) return;
    const int lane = threadIdx.x & 31;
    const uint4* line = stage + 8 * lane;
    uint32_t m[4] = {0, 0, 0, 0};  // bit b of m[q]: slot base_ + 32 q + b matches the digest
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      if (base_ + 16 * v >= end_) continue;
      uint32_t bits = 0;
      if (aligned_) {
        const uint4 w = line[(v + lane) & 7];
        bits = byte_matches(w.x, digest_) | (byte_matches(w.y, digest_) << 4) |
               (byte_matches(w.z, digest_) << 8) | (byte_matches(w.w, digest_) << 12);
      } else {
        uint32_t empty;
        scan16(digests, base_ + 16 * v, end_, digest_, &bits, &empty);
      }
      m[v / 2] |= bits << (16 * (v % 2));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      while (m[q] != 0 && hit_ < 0) {
        const int64_t g = base_ + 32 * q + __ffs(m[q]) - 1;
        m[q] &= m[q] - 1;
        if (__ldcs(reinterpret_cast<const long long*>(table_keys + g)) == key) hit_ = g;
      }
    }
    base_ = (hit_ >= 0 || base_ + 128 >= end_) ? -1 : base_ + 128;
  }

  bool aligned_;    // the lane's bucket is whole aligned 16-byte chunks (copied by the warp)
  int64_t base_;    // the lane's next step; -1: done
  int64_t end_;     // one past its bucket
  uint8_t digest_;  // its key's digest
  int64_t hit_ = -1;
};

/**
 * @brief The tile kernel: one tile of 4 threads per key, the probe (find_probe), then the key's
 * row copied by the tile: lane r takes vectors r, r + 4, ..., kRowsUnroll loads before the stores.
 */
template <typename V>
__global__ void __launch_bounds__(FindRowsShape::kThreads, FindRowsShape::kBlocks)
    find_rows_kernel(FindRowsParams p) {
  using S = FindRowsShape;
  const auto tile = cg::tiled_partition<S::kTile>(cg::this_thread_block());
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * S::kThreads + threadIdx.x) / S::kTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = __ldcs(reinterpret_cast<const long long*>(p.keys + i));
  const int64_t t = __ldcs(reinterpret_cast<const long long*>(p.table_ids + i));
  int64_t local = -1;  // every lane of the tile gets the answer
  KeyHome home;
  if (key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    const int64_t g =
        find_probe<S::kTile, S::kVec>(tile, p.table_keys, p.digests, key, home, nullptr).hit;
    if (g >= 0) local = g - home.layout.offset;
  }
  const int rank = tile.thread_rank();
  if (rank == 0) {
    __stcs(reinterpret_cast<long long*>(p.out_slots + i), static_cast<long long>(local));
    __stcs(reinterpret_cast<unsigned char*>(p.out_found + i),
           static_cast<unsigned char>(local >= 0));
  }
  const int vpr = p.vecs_per_row;
  const bool has_row = local >= 0 && local < p.capacity;  // else a zero row
  const V* src = reinterpret_cast<const V*>(p.values) + (has_row ? local : 0) * vpr;
  V* dst = reinterpret_cast<V*>(p.out_rows) + i * vpr;
  for (int c0 = 0; c0 < vpr; c0 += S::kTile * kRowsUnroll) {
    V v[kRowsUnroll];
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int c = c0 + S::kTile * u + rank;
      if (has_row && c < vpr) {
        v[u] = __ldcs(src + c);
      } else {
        memset(&v[u], 0, sizeof(V));
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int c = c0 + S::kTile * u + rank;
      if (c < vpr) __stcs(dst + c, v[u]);
    }
  }
}

/**
 * @brief The staged kernel's row copy: the warp's 32 keys (first key w0, `local` of key j held by
 * lane j) have one contiguous span of 32 * vpr output vectors, so lane l takes vectors
 * f = l, l + 32, ... of it (row f / vpr, column f % vpr), kStagedUnroll a trip, loaded into
 * `stage` (the warp's 4 KB) by asynchronous copies, then stored. Each lane reads back only what it
 * copied itself. Needs vpr * 32 + 256 < 2^32 (the selector's bound).
 */
__device__ __forceinline__ void staged_copy_rows(const FindRowsParams& p, int64_t w0, int64_t local,
                                                 uint4* stage) {
  const int lane = threadIdx.x & 31;
  const auto vpr = static_cast<uint32_t>(p.vecs_per_row);
  const int64_t keys = p.n - w0 < 32 ? p.n - w0 : 32;  // the last warp may hold fewer
  const auto total = static_cast<uint32_t>(keys) * vpr;
  const auto* values = reinterpret_cast<const uint4*>(p.values);
  uint4* dst = reinterpret_cast<uint4*>(p.out_rows) + w0 * static_cast<int64_t>(vpr);
  const uint64_t policy = evict_first_policy();
  for (uint32_t f0 = 0; f0 < total; f0 += 32u * kStagedUnroll) {
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const uint32_t f = f0 + 32u * u + lane;
      const uint32_t j = f / vpr;  // the warp's key; past `keys` for lanes beyond the span
      const int64_t s = __shfl_sync(0xffffffffu, local, static_cast<int>(j & 31));
      if (f < total && s >= 0 && s < p.capacity) {
        copy16_async(stage + 32 * u + lane, values + s * static_cast<int64_t>(vpr) + (f - j * vpr),
                     policy);
      } else {
        stage[32 * u + lane] = make_uint4(0, 0, 0, 0);
      }
    }
    wait_async_copies();
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const uint32_t f = f0 + 32u * u + lane;
      if (f < total) __stcs(dst + f, stage[32 * u + lane]);
    }
  }
}

/**
 * @brief The staged kernel: one key a lane (WarpStagedProbe), then the warp copies its keys' rows
 * (staged_copy_rows) through the same shared memory; every lane stays to the end for the warp's
 * shuffles.
 */
__global__ void __launch_bounds__(FindRowsStagedShape::kThreads, FindRowsStagedShape::kBlocks)
    find_rows_staged_kernel(FindRowsParams p) {
  using S = FindRowsStagedShape;
  static_assert(S::kTile == 1 && kStagedUnroll * 16 * 32 <= 32 * 128, "stage: 128 B a thread");
  __shared__ uint4 stage[S::kThreads * 8];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * S::kThreads + threadIdx.x;
  const int64_t w0 = i & ~int64_t{31};
  if (w0 >= p.n) return;  // a whole warp past the end
  uint4* const warp_stage = stage + 8 * (threadIdx.x & ~31u);
  int64_t key = 0;
  KeyHome home{};
  bool live = false;
  if (i < p.n) {
    key = __ldcs(reinterpret_cast<const long long*>(p.keys + i));
    const int64_t t = __ldcs(reinterpret_cast<const long long*>(p.table_ids + i));
    live = key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home);
  }
  const int64_t g = WarpStagedProbe(p.digests, live, home).run(warp_stage, p.table_keys,
                                                               p.digests, key);
  const int64_t local = g >= 0 ? g - home.layout.offset : -1;
  if (i < p.n) {
    __stcs(reinterpret_cast<long long*>(p.out_slots + i), static_cast<long long>(local));
    __stcs(reinterpret_cast<unsigned char*>(p.out_found + i),
           static_cast<unsigned char>(local >= 0));
  }
  __syncwarp();  // every lane's digests read before the rows reuse the stage
  staged_copy_rows(p, w0, local, warp_stage);
}

/** @brief Launcher of the tile kernel: one tile per key, vectors of V bytes. */
template <typename V>
void launch_find_rows(const FindRowsParams& p, cudaStream_t stream) {
  find_rows_kernel<V>
      <<<blocks_for(p.n, FindRowsShape::kKeysPerBlock), FindRowsShape::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/**
 * @brief Launcher of the staged kernel. Its 24 blocks a SM need 192 KB of shared memory, so the
 * kernel asks for the largest shared-memory carveout, once per device.
 */
inline void launch_find_rows_staged(const FindRowsParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> carved{0};  // bit d: done on device d (devices 0..63)
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((carved.load() & bit) == 0 || bit == 0) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(find_rows_staged_kernel,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    carved.fetch_or(bit);
  }
  using S = FindRowsStagedShape;
  find_rows_staged_kernel<<<blocks_for(p.n, S::kKeysPerBlock), S::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/**
 * @brief Selector: the widest vector dividing the row and both base addresses (as gather_rows);
 * rows of 16-byte vectors (up to 2^26 of them) take the staged kernel, the others the tile
 * kernel. A row of 0 bytes copies nothing (0 vectors a row).
 */
inline void select_find_rows(FindRowsParams p, int64_t row_bytes, cudaStream_t stream) {
  if (p.n == 0) return;
  const int vec = row_vector_bytes(row_bytes, p.values, p.out_rows);
  DEMB_CHECK_VALUE(row_bytes / vec <= INT32_MAX - FindRowsShape::kTile * kRowsUnroll,
                   "dynamicemb.find_rows (CUDA): rows of at most 2^31 - 17 vectors, got ",
                   row_bytes, " bytes");
  p.vecs_per_row = static_cast<int>(row_bytes / vec);
  switch (vec) {
    case 16:
      if (p.vecs_per_row <= (1 << 26)) {
        launch_find_rows_staged(p, stream);
      } else {
        launch_find_rows<uint4>(p, stream);
      }
      break;
    case 8: launch_find_rows<uint2>(p, stream); break;
    case 4: launch_find_rows<uint32_t>(p, stream); break;
    case 2: launch_find_rows<uint16_t>(p, stream); break;
    default: launch_find_rows<uint8_t>(p, stream); break;
  }
}

}  // namespace cuda_table
}  // namespace dynamicemb
