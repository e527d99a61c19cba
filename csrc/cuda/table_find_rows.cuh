/**
 * @file table_find_rows.cuh
 * @brief find_rows on CUDA (find and the found keys' rows in one kernel): params struct, kernel,
 * launcher, selector (STYLE rule 7).
 *
 * find then gather_rows runs two kernels one after the other: the probes (a chain of dependent
 * loads per key, latency-bound) and then the row copy (bandwidth-bound). Here the tile of 4
 * threads that probes a key (as find) copies the key's row as soon as it has the slot, so while
 * some tiles copy, others probe: the copy hides under the probes' latency instead of following
 * them. The tile's 4 lanes take the row's 16-byte (or narrower) vectors in turn, kRowsUnroll loads
 * each before the first store; a warp's 8 tiles copy 8 rows at once, 64 contiguous bytes of each
 * per instruction (whole 32-byte sectors). The rows are read and written evict-first
 * (__ldcs / __stcs), like everything a lookup touches once (table_find.cuh): at dim 64 they are
 * ~0.5 GB per 1M keys, which would otherwise flush the digest lines from the L2 on every call.
 */
#pragma once

#include <cooperative_groups.h>

#include "table_common.cuh"
#include "table_find.cuh"
#include "table_rows.cuh"

namespace dynamicemb {
namespace cuda_table {

namespace cg = cooperative_groups;

constexpr int kRowsUnroll = 4;            // vectors a lane loads before it stores
constexpr int kFindRowsBlocksPerSm = 6;   // __launch_bounds__: at most 40 registers, 75% occupancy

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

/** @brief One tile per key: the probe (find_probe), then the key's row copied by the tile. */
template <typename V>
__global__ void __launch_bounds__(kBlockThreads, kFindRowsBlocksPerSm)
    find_rows_kernel(FindRowsParams p) {
  const auto tile = cg::tiled_partition<kFindTile>(cg::this_thread_block());
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x) / kFindTile;
  if (i >= p.n) return;  // whole tiles leave together: i is the same for a tile
  const int64_t key = __ldcs(reinterpret_cast<const long long*>(p.keys + i));
  const int64_t t = __ldcs(reinterpret_cast<const long long*>(p.table_ids + i));
  int64_t local = -1;  // every lane of the tile gets the answer
  KeyHome home;
  if (key_home(key, t, p.num_tables, p.slot_offsets, p.bucket_caps, &home)) {
    const int64_t g = find_probe(tile, p.table_keys, p.digests, key, home, nullptr).hit;
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
  for (int c0 = 0; c0 < vpr; c0 += kFindTile * kRowsUnroll) {
    V v[kRowsUnroll];
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int c = c0 + kFindTile * u + rank;
      if (has_row && c < vpr) {
        v[u] = __ldcs(src + c);
      } else {
        memset(&v[u], 0, sizeof(V));
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int c = c0 + kFindTile * u + rank;
      if (c < vpr) __stcs(dst + c, v[u]);
    }
  }
}

/** @brief Launcher: one tile per key, vectors of V bytes. */
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
  DEMB_CHECK_VALUE(row_bytes / vec <= INT32_MAX - kFindTile * kRowsUnroll,
                   "dynamicemb.find_rows (CUDA): rows of at most 2^31 - 17 vectors, got ",
                   row_bytes, " bytes");
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
