/**
 * @file table_rows.cuh
 * @brief gather_rows / scatter_rows on CUDA: params struct, kernels, launchers, selector.
 *
 * Rows are copied as raw bytes, so one kernel serves every dtype: the selector picks the widest
 * vector (16, 8, 4, 2 or 1 bytes) that divides the row and the base addresses, and each thread
 * moves one vector. A slot outside [0, capacity) (-1 by contract) reads as zeros and is skipped on
 * write. scatter_rows keeps "last write wins" for repeated slots: (slot, position) pairs are
 * radix-sorted, which keeps positions in order within a slot, and only the last of each run writes.
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

struct RowsParams {
  const char* src;     // gather: values; scatter: rows
  char* dst;           // gather: out; scatter: values
  const int64_t* slots;         // (n,) local slots (gather), or sorted slots (scatter)
  const int32_t* order;         // scatter: sorted positions into rows; null for gather
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

template <typename V>
__global__ void __launch_bounds__(kBlockThreads) scatter_rows_kernel(RowsParams p) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (e >= p.n * p.vecs_per_row) return;
  const int64_t q = e / p.vecs_per_row, c = e - q * p.vecs_per_row;
  const int64_t s = p.slots[q];
  if (s < 0 || s >= p.capacity) return;
  if (q + 1 < p.n && p.slots[q + 1] == s) return;  // a later position writes this slot
  reinterpret_cast<V*>(p.dst)[s * p.vecs_per_row + c] =
      reinterpret_cast<const V*>(p.src)[int64_t{p.order[q]} * p.vecs_per_row + c];
}

/** @brief Widest vector size dividing the row and both base addresses. */
inline int row_vector_bytes(int64_t row_bytes, const void* a, const void* b) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  for (int v : {16, 8, 4, 2}) {
    if (row_bytes % v == 0 && bits % v == 0) return v;
  }
  return 1;
}

template <template <typename> class Kernel>
void launch_rows(RowsParams p, int64_t row_bytes, int vec, cudaStream_t stream) {
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
               slots.data_ptr<int64_t>(), nullptr, slots.numel(), values.size(0), 0};
  launch_rows<GatherLauncher>(p, row_bytes, row_vector_bytes(row_bytes, p.src, p.dst), stream);
}

/** @brief Selector for scatter_rows: sort (slot, position), then the last of each slot writes. */
inline void select_scatter_rows(at::Tensor& values, const at::Tensor& slots, const at::Tensor& rows,
                                cudaStream_t stream) {
  const int64_t n = slots.numel();
  const int64_t row_bytes = values.size(1) * values.element_size();
  if (n == 0 || row_bytes == 0) return;
  DEMB_CHECK_VALUE(n <= INT32_MAX, "dynamicemb scatter_rows (CUDA): at most 2^31-1 rows per call");
  const auto dev = slots.options();
  at::Tensor pos = at::arange(n, dev.dtype(at::kInt));
  at::Tensor sorted_slots = at::empty({n}, dev.dtype(at::kLong));
  at::Tensor sorted_pos = at::empty({n}, dev.dtype(at::kInt));
  // -1 sorts last as an unsigned key; every bit is sorted so any out-of-range value stays apart.
  auto* keys_in = reinterpret_cast<const uint64_t*>(slots.data_ptr<int64_t>());
  auto* keys_out = reinterpret_cast<uint64_t*>(sorted_slots.data_ptr<int64_t>());
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                 pos.data_ptr<int32_t>(),
                                                 sorted_pos.data_ptr<int32_t>(),
                                                 static_cast<int>(n), 0, 64, stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, dev.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys_out,
                                                 pos.data_ptr<int32_t>(),
                                                 sorted_pos.data_ptr<int32_t>(),
                                                 static_cast<int>(n), 0, 64, stream));
  RowsParams p{static_cast<const char*>(rows.data_ptr()), static_cast<char*>(values.data_ptr()),
               sorted_slots.data_ptr<int64_t>(), sorted_pos.data_ptr<int32_t>(), n,
               values.size(0), 0};
  launch_rows<ScatterLauncher>(p, row_bytes, row_vector_bytes(row_bytes, p.src, p.dst), stream);
}

}  // namespace cuda_table
}  // namespace dynamicemb
