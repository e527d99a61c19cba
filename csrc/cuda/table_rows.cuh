/**
 * @file table_rows.cuh
 * @brief gather_rows / scatter_rows on CUDA: params struct, kernels, launchers, selector.
 *
 * Rows are copied as raw bytes, so one kernel serves every dtype: the selector picks the widest
 * vector (16, 8, 4, 2 or 1 bytes) that divides the row and the base addresses, and each thread
 * moves one vector. A slot outside [0, capacity) (-1 by contract) reads as zeros and is skipped on
 * write. scatter_rows keeps "last write wins" for repeated slots: a first kernel records, per
 * distinct slot of the call, the last position that names it (an open-addressing map of >= 2n
 * 8-byte words, each slot << 30 | its last position: one atomicCAS claims a word for a slot named
 * once, an atomicMax raises the position of one named again; L2-resident for the batch sizes of a
 * training step), and the copy kernel writes only the rows of those positions. Two O(n) kernels
 * and one fill, where sorting (slot, position) pairs by all 64 bits of the slot took eight radix
 * passes. (The one-word map replaced a slot word and a position word per entry with two atomics:
 * 43 -> 37 us for 1M slots on the H200 and a third less to fill.)
 */
#pragma once

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

struct RowsParams {
  const char* src;     // gather: values; scatter: rows
  char* dst;           // gather: out; scatter: values
  const int64_t* slots;         // (n,) local slots
  const int32_t* where;         // scatter: (n,) map entry of each position's slot, -1 if none
  const unsigned long long* map;  // scatter: the map's words (slot << 30 | last position)
  int64_t n;
  int64_t capacity;             // rows of the values tensor
  int64_t vecs_per_row;         // row bytes / vector bytes
};

template <typename V>
__global__ void __launch_bounds__(kBlockThreads) gather_rows_kernel(RowsParams p) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (e >= p.n * p.vecs_per_row) return;
  const int64_t r = e / p.vecs_per_row, c = e - r * p.vecs_per_row;
  const int64_t s = p.slots[r];
  V v;
  if (s >= 0 && s < p.capacity) {
    v = reinterpret_cast<const V*>(p.src)[s * p.vecs_per_row + c];
  } else {
    memset(&v, 0, sizeof(V));
  }
  reinterpret_cast<V*>(p.dst)[e] = v;
}

constexpr int kPositionBits = 30;         // positions q < n <= 2^30: a map word's low bits
constexpr unsigned long long kNoEntry = ~0ull;  // a free map word (its slot bits are no slot)
constexpr unsigned long long kPositionMask = (1ull << kPositionBits) - 1;

/**
 * @brief For each position q with a slot s in [0, capacity): the map word of s in `where[q]` (-1
 * otherwise); the word holds s << 30 | the largest q naming s. The first position of a slot to
 * arrive claims a free word with atomicCAS; a later one that finds its slot there raises the
 * position with atomicMax (the slot bits are equal, so the position decides). The map has a power
 * of two >= 2n words, all kNoEntry at the start; slots < 2^34 - 1 (the selector's check), so no
 * slot looks like a free word.
 */
__global__ void __launch_bounds__(kBlockThreads)
    scatter_last_kernel(const int64_t* __restrict__ slots, int64_t n, int64_t capacity,
                        unsigned long long* __restrict__ map, int64_t mask,
                        int32_t* __restrict__ where) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (q >= n) return;
  const int64_t s = slots[q];
  if (s < 0 || s >= capacity) {
    where[q] = -1;
    return;
  }
  const auto slot = static_cast<unsigned long long>(s);
  const unsigned long long mine = (slot << kPositionBits) | static_cast<unsigned long long>(q);
  for (int64_t h = static_cast<int64_t>(hash_key(s) & static_cast<uint64_t>(mask));;
       h = (h + 1) & mask) {
    const unsigned long long old = atomicCAS(map + h, kNoEntry, mine);
    if (old == kNoEntry || (old >> kPositionBits) == slot) {  // at most n of >= 2n words: it ends
      if (old != kNoEntry && old < mine) atomicMax(map + h, mine);
      where[q] = static_cast<int32_t>(h);
      return;
    }
  }
}

template <typename V>
__global__ void __launch_bounds__(kBlockThreads) scatter_rows_kernel(RowsParams p) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (e >= p.n * p.vecs_per_row) return;
  const int64_t q = e / p.vecs_per_row, c = e - q * p.vecs_per_row;
  const int32_t h = p.where[q];
  // out of range, or a later position writes this slot
  if (h < 0 || (p.map[h] & kPositionMask) != static_cast<unsigned long long>(q)) return;
  reinterpret_cast<V*>(p.dst)[p.slots[q] * p.vecs_per_row + c] =
      reinterpret_cast<const V*>(p.src)[q * p.vecs_per_row + c];
}

/** @brief Widest vector size dividing the row and both base addresses. */
inline int row_vector_bytes(int64_t row_bytes, const void* a, const void* b) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  for (int v : {16, 8, 4, 2}) {
    if (row_bytes % v == 0 && bits % v == 0) return v;
  }
  return 1;
}

template <template <typename> class Kernel, typename Params>
void launch_rows(Params p, int64_t row_bytes, int vec, cudaStream_t stream) {
  p.vecs_per_row = row_bytes / vec;
  const int64_t blocks = blocks_for(p.n * p.vecs_per_row, kBlockThreads);
  switch (vec) {
    case 16: Kernel<uint4>::launch(p, blocks, stream); break;
    case 8: Kernel<uint2>::launch(p, blocks, stream); break;
    case 4: Kernel<uint32_t>::launch(p, blocks, stream); break;
    case 2: Kernel<uint16_t>::launch(p, blocks, stream); break;
    default: Kernel<uint8_t>::launch(p, blocks, stream); break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename V>
struct GatherLauncher {
  static void launch(const RowsParams& p, int64_t blocks, cudaStream_t s) {
    gather_rows_kernel<V><<<blocks, kBlockThreads, 0, s>>>(p);
  }
};

template <typename V>
struct ScatterLauncher {
  static void launch(const RowsParams& p, int64_t blocks, cudaStream_t s) {
    scatter_rows_kernel<V><<<blocks, kBlockThreads, 0, s>>>(p);
  }
};

/** @brief Selector for gather_rows: (n, width) rows of `values` at `slots`. */
inline void select_gather_rows(const at::Tensor& values, const at::Tensor& slots, at::Tensor& out,
                               cudaStream_t stream) {
  const int64_t row_bytes = values.size(1) * values.element_size();
  if (slots.numel() == 0 || row_bytes == 0) return;
  RowsParams p{static_cast<const char*>(values.data_ptr()), static_cast<char*>(out.data_ptr()),
               slots.data_ptr<int64_t>(), nullptr, nullptr, slots.numel(), values.size(0), 0};
  launch_rows<GatherLauncher>(p, row_bytes, row_vector_bytes(row_bytes, p.src, p.dst), stream);
}

/** @brief Selector for scatter_rows: the last position of each slot, then the copy. */
inline void select_scatter_rows(at::Tensor& values, const at::Tensor& slots, const at::Tensor& rows,
                                cudaStream_t stream) {
  const int64_t n = slots.numel();
  const int64_t row_bytes = values.size(1) * values.element_size();
  if (n == 0 || row_bytes == 0) return;
  // map words (a power of two >= 2n) are named by int32 in `where`, and positions fill a word's
  // low 30 bits: n <= 2^30 keeps both in range
  DEMB_CHECK_VALUE(n <= (int64_t{1} << kPositionBits),
                   "dynamicemb scatter_rows (CUDA): at most 2^30 rows per call, got ", n,
                   "; split the call");
  DEMB_CHECK_VALUE(values.size(0) < (int64_t{1} << (64 - kPositionBits)) - 1,
                   "dynamicemb scatter_rows (CUDA): at most 2^34 - 2 value rows, got ",
                   values.size(0));
  int64_t entries = 2;
  while (entries < 2 * n) entries <<= 1;
  // one buffer: the map's words (8 B, filled with 0xff bytes: kNoEntry), then where (4 B each)
  at::Tensor scratch = at::empty({entries * 8 + n * 4}, slots.options().dtype(at::kByte));
  auto* base = static_cast<char*>(scratch.data_ptr());
  auto* map = reinterpret_cast<unsigned long long*>(base);
  auto* where = reinterpret_cast<int32_t*>(base + entries * 8);
  C10_CUDA_CHECK(cudaMemsetAsync(base, 0xff, entries * 8, stream));
  scatter_last_kernel<<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream>>>(
      slots.data_ptr<int64_t>(), n, values.size(0), map, entries - 1, where);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  RowsParams p{static_cast<const char*>(rows.data_ptr()), static_cast<char*>(values.data_ptr()),
               slots.data_ptr<int64_t>(), where, map, n, values.size(0), 0};
  launch_rows<ScatterLauncher>(p, row_bytes, row_vector_bytes(row_bytes, p.src, p.dst), stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
