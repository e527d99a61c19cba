/**
 * @file table_find_rows.cuh
 * @brief find_rows on CUDA (find and the found keys' rows in one kernel): params struct, kernel,
 * launcher, selector (STYLE rule 7).
 *
 * find then gather_rows runs two kernels one after the other: the probes (a chain of dependent
 * loads per key, latency-bound) and then the row copy (bandwidth-bound). Here each warp probes its
 * 8 keys (a tile of 4 threads per key, as find) and copies their rows itself, so while one warp
 * copies, others probe: the copy hides under the probes' latency instead of following them. For
 * the copy the warp's 32 lanes spread over the 8 rows' 16-byte (or narrower) vectors, lane by
 * lane, so consecutive lanes read consecutive bytes of one row (coalesced, as gather_rows), and a
 * lane issues kRowsUnroll loads before its first store.
 */
#pragma once

#include <cooperative_groups.h>

#include "table_common.cuh"
#include "table_find.cuh"
#include "table_rows.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

constexpr int kRowsUnroll = 4;                   // vectors a lane loads before it stores
constexpr int kKeysPerWarp = 32 / kFindTile;     // 8 keys probed (and copied) per warp

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

/**
 * @brief One warp: 8 keys probed by tiles of 4 threads, then their rows copied by all 32 lanes.
 * No thread returns early: the copy's shuffles need every lane of the warp (lanes past n have no
 * key and copy nothing).
 */
template <typename V>
__global__ void __launch_bounds__(kBlockThreads) find_rows_kernel(FindRowsParams p) {
  const auto tile = cg::tiled_partition<kFindTile>(cg::this_thread_block());
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  const int64_t i = thread / kFindTile;  // the same for a tile
  int64_t local = -1;                    // every lane of a tile gets its key's answer
  if (i < p.n) {
    KeyHome home;
    if (key_home(p.keys[i], p.table_ids[i], p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
      const int64_t g =
          tile_probe<kFindVec>(tile, p.table_keys, p.digests, p.keys[i], home, false).hit;
      if (g >= 0) local = g - home.layout.offset;
    }
    if (tile.thread_rank() == 0) {
      p.out_slots[i] = local;
      p.out_found[i] = local >= 0;
    }
  }
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t first = (thread - lane) / kFindTile;  // the warp's first key
  const int total = kKeysPerWarp * p.vecs_per_row;    // vectors of the warp's 8 rows
  const V* src = reinterpret_cast<const V*>(p.values);
  V* dst = reinterpret_cast<V*>(p.out_rows);
  for (int base = 0; base < total; base += 32 * kRowsUnroll) {  // the same trip count per lane
    V v[kRowsUnroll];
    int64_t to[kRowsUnroll];
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int e = base + 32 * u + lane;
      const int r = min(e / p.vecs_per_row, kKeysPerWarp - 1);  // row of the warp (clamped past the end)
      const int c = e - r * p.vecs_per_row;
      const int64_t s = __shfl_sync(0xffffffffu, local, r * kFindTile);
      to[u] = (e < total && first + r < p.n) ? (first + r) * p.vecs_per_row + c : -1;
      if (to[u] >= 0 && s >= 0 && s < p.capacity) {
        v[u] = src[s * p.vecs_per_row + c];
      } else {
        memset(&v[u], 0, sizeof(V));
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      if (to[u] >= 0) dst[to[u]] = v[u];
    }
  }
}

/** @brief Launcher: one warp per 8 keys, vectors of V bytes. */
template <typename V>
void launch_find_rows(const FindRowsParams& p, cudaStream_t stream) {
  find_rows_kernel<V>
      <<<blocks_for(p.n, kBlockThreads / kFindTile), kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/**
 * @brief Selector: the widest vector dividing the row and both base addresses (as gather_rows).
 * A row of 0 bytes copies nothing (0 vectors a row).
 */
inline void select_find_rows(FindRowsParams p, int64_t row_bytes, cudaStream_t stream) {
  if (p.n == 0) return;
  const int vec = row_vector_bytes(row_bytes, p.values, p.out_rows);
  DEMB_CHECK_VALUE(row_bytes / vec <= INT32_MAX / kKeysPerWarp,
                   "dynamicemb.find_rows (CUDA): rows of at most 2^28 vectors, got ", row_bytes,
                   " bytes");
  p.vecs_per_row = static_cast<int>(row_bytes / vec);
  switch (vec) {
    case 16: launch_find_rows<uint4>(p, stream); break;
    case 8: launch_find_rows<uint2>(p, stream); break;
    case 4: launch_find_rows<uint32_t>(p, stream); break;
    case 2: launch_find_rows<uint16_t>(p, stream); break;
    default: launch_find_rows<uint8_t>(p, stream); break;
  }
}

}  // namespace cuda_table
}  // namespace dynamicemb
