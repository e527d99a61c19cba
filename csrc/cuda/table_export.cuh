/**
 * @file table_export.cuh
 * @brief export_if on CUDA: params struct, kernels, launcher, selector (STYLE rule 7).
 *
 * The output is every occupied slot passing its table's threshold, in global slot order, so it is
 * a stream compaction: a counting pass (per block), a scan of the block counts, one read of the
 * total to size the outputs (the only host synchronisation: the count depends on the data), and a
 * writing pass that places each block's matches at its offset with block-wide scans. Counting
 * threads own 16 consecutive slots (one 16-byte digest load where aligned); score words are read
 * only for occupied slots, and not at all in the counting pass when the threshold is INT64_MIN
 * ("export everything").
 */
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

constexpr int kExportSlotsPerThread = 16;
constexpr int64_t kExportSlotsPerBlock = int64_t{kExportSlotsPerThread} * kBlockThreads;

struct ExportParams {
  const int64_t* table_keys;
  const uint8_t* digests;
  const int64_t* scores;
  const int64_t* slot_offsets;  // (T+1,)
  int64_t num_tables;
  int64_t total_slots;
  const int64_t* thresholds;  // (T,)
  int64_t column;             // 0 or 1
  int64_t* block_counts;      // (num_blocks,) pass 1 output
  const int64_t* block_offsets;  // (num_blocks,) exclusive scan, pass 2 input
  int64_t* out_keys;
  int64_t* out_slots;
  int64_t* out_scores;
  int64_t* out_table_ids;
};

/** @brief Table owning global slot g: the last t with slot_offsets[t] <= g (binary search). */
__device__ __forceinline__ int64_t table_of_slot(const int64_t* offsets, int64_t num_tables,
                                                 int64_t g) {
  int64_t lo = 0, hi = num_tables - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/**
 * @brief Bit k set where slot first+k (k < 16) is exported. `*t` is the table of slot `first` on
 * entry and is advanced across table boundaries; with `need_words` false and a threshold of
 * INT64_MIN the words are not read.
 */
__device__ __forceinline__ uint32_t export_mask(const ExportParams& p, int64_t first,
                                                int64_t* t) {
  uint8_t d[kExportSlotsPerThread];
  const uint8_t* src = p.digests + first;
  if (first + kExportSlotsPerThread <= p.total_slots &&
      (reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
    *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int k = 0; k < kExportSlotsPerThread; ++k)
      d[k] = first + k < p.total_slots ? src[k] : 0;
  }
  uint32_t mask = 0;
#pragma unroll
  for (int k = 0; k < kExportSlotsPerThread; ++k) {
    if (d[k] == 0) continue;
    const int64_t g = first + k;
    while (*t + 1 < p.num_tables && g >= p.slot_offsets[*t + 1]) ++*t;
    const int64_t limit = p.thresholds[*t];
    if (limit == INT64_MIN || p.scores[2 * g + p.column] >= limit) mask |= 1u << k;
  }
  return mask;
}

__global__ void __launch_bounds__(kBlockThreads) export_count_kernel(ExportParams p) {
  using BlockReduce = cub::BlockReduce<int64_t, kBlockThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kExportSlotsPerBlock +
                        int64_t{threadIdx.x} * kExportSlotsPerThread;
  int64_t count = 0;
  if (first < p.total_slots) {
    int64_t t = table_of_slot(p.slot_offsets, p.num_tables, first);
    count = __popc(export_mask(p, first, &t));
  }
  const int64_t total = BlockReduce(temp).Sum(count);
  if (threadIdx.x == 0) p.block_counts[blockIdx.x] = total;
}

/**
 * @brief Writes a block's matches in slot order. Unlike the counting pass, thread k takes slots
 * k, k + 256, ... of the block's range, one block-wide scan per round, so consecutive threads write
 * consecutive outputs (coalesced stores; a thread writing its own 16-slot run would not be).
 */
__global__ void __launch_bounds__(kBlockThreads) export_write_kernel(ExportParams p) {
  using BlockScan = cub::BlockScan<int32_t, kBlockThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  const int64_t block_first = static_cast<int64_t>(blockIdx.x) * kExportSlotsPerBlock;
  int64_t pos = p.block_offsets[blockIdx.x];
  const int64_t first_mine = block_first + threadIdx.x;
  int64_t t = table_of_slot(p.slot_offsets, p.num_tables,
                            first_mine < p.total_slots ? first_mine : p.total_slots - 1);
  for (int round = 0; round < kExportSlotsPerThread; ++round) {
    const int64_t g = block_first + int64_t{round} * kBlockThreads + threadIdx.x;
    bool keep = false;
    if (g < p.total_slots && p.digests[g] != 0) {
      while (t + 1 < p.num_tables && g >= p.slot_offsets[t + 1]) ++t;
      const int64_t limit = p.thresholds[t];
      keep = limit == INT64_MIN || p.scores[2 * g + p.column] >= limit;
    }
    int32_t offset, total;
    BlockScan(temp).ExclusiveSum(keep ? 1 : 0, offset, total);
    if (keep) {
      const int64_t o = pos + offset;
      int64_t w[2];
      load_words(p.scores, g, w);
      p.out_keys[o] = p.table_keys[g];
      p.out_slots[o] = g - p.slot_offsets[t];
      p.out_scores[2 * o] = w[0];
      p.out_scores[2 * o + 1] = w[1];
      p.out_table_ids[o] = t;
    }
    pos += total;
    __syncthreads();  // temp is reused by the next round's scan
  }
}

/** @brief Launcher: count, scan, size the outputs, write. Returns (keys, slots, scores, ids). */
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> launch_export(
    ExportParams p, const at::TensorOptions& dev, cudaStream_t stream) {
  const int64_t blocks = blocks_for(p.total_slots, kExportSlotsPerBlock);
  at::Tensor counts = at::empty({blocks}, dev.dtype(at::kLong));
  p.block_counts = counts.data_ptr<int64_t>();
  export_count_kernel<<<blocks, kBlockThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor ends = counts.cumsum(0);
  const int64_t m = ends[-1].item<int64_t>();
  at::Tensor offsets = ends - counts;
  at::Tensor keys = at::empty({m}, dev.dtype(at::kLong));
  at::Tensor slots = at::empty({m}, dev.dtype(at::kLong));
  at::Tensor scores = at::empty({m, 2}, dev.dtype(at::kLong));
  at::Tensor table_ids = at::empty({m}, dev.dtype(at::kLong));
  if (m > 0) {
    p.block_offsets = offsets.data_ptr<int64_t>();
    p.out_keys = keys.data_ptr<int64_t>();
    p.out_slots = slots.data_ptr<int64_t>();
    p.out_scores = scores.data_ptr<int64_t>();
    p.out_table_ids = table_ids.data_ptr<int64_t>();
    export_write_kernel<<<blocks, kBlockThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {keys, slots, scores, table_ids};
}

/** @brief Selector: one variant; an empty table exports nothing without a launch. */
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> select_export(
    const ExportParams& p, const at::TensorOptions& dev, cudaStream_t stream) {
  if (p.total_slots == 0 || p.num_tables == 0) {
    at::Tensor e = at::empty({0}, dev.dtype(at::kLong));
    return {e, e.clone(), at::empty({0, 2}, dev.dtype(at::kLong)), e.clone()};
  }
  return launch_export(p, dev, stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
