// grouped_pooled_gather on CUDA: one warp per bag.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_common.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- pooled gather: one warp per bag ----

/// Adds ``w`` times row ``r``'s columns ``[d, d + 4)`` (those below ``D``) to ``acc``: one 16-byte
/// load for float rows whose columns are 16-byte aligned, else element by element.
template <typename E>
__device__ inline void add_columns(const E* __restrict__ r, int64_t d, int64_t D, float w,
                                   bool vec4, float acc[4]) {
  if constexpr (sizeof(E) == sizeof(float)) {
    if (vec4 && d + 3 < D) {
      const float4 v = *reinterpret_cast<const float4*>(r + d);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
      return;
    }
  }
  for (int e = 0; e < 4; ++e) {
    if (d + e < D) acc[e] += w * static_cast<float>(r[d + e]);
  }
}

/// One warp per bag, each lane 4 adjacent columns (a row of dim <= 128 in one pass). The warp
/// resolves the slots of 32 positions at once (each lane one ``slots[inverse[i]]``) and hands them
/// round by shuffles, so the row loads of a bag's positions do not wait on each other's index
/// loads. Each column sums its positions in position order, as the CPU kernel does.
template <typename E>
__global__ void pooled_kernel(const E* __restrict__ values, DeviceMeta meta,
                              const int64_t* __restrict__ slots, const int64_t* __restrict__ inverse,
                              const int64_t* __restrict__ offsets, const float* __restrict__ weights,
                              const int64_t* __restrict__ ft, const int64_t* __restrict__ dofs,
                              int64_t num_bags, int64_t B, int64_t total_dim, int64_t mode,
                              float* __restrict__ out) {
  const int64_t bag = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (bag >= num_bags) return;  // the whole warp: threadIdx.y picks the bag
  const int lane = int(threadIdx.x);
  const int64_t f = bag / B, s = bag % B, t = ft[f];
  const int64_t D = meta.dim(t), W = meta.width(t), cap = meta.capacity(t);
  const E* base = values + meta.offset(t);
  const bool vec4 = W % 4 == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
  const int64_t lo = offsets[bag], hi = offsets[bag + 1];
  const float scale = (mode == kPoolMean && hi > lo) ? 1.0f / float(hi - lo) : 1.0f;
  float* dst = out + s * total_dim + dofs[f];
  for (int64_t d0 = 0; d0 < D; d0 += kWarp * 4) {
    const int64_t d = d0 + lane * 4;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i0 = lo; i0 < hi; i0 += kWarp) {
      const int n = int(hi - i0 < kWarp ? hi - i0 : kWarp);
      int64_t mine = -1;
      float my_w = 0.0f;
      if (lane < n) {
        const int64_t slot = slots[inverse[i0 + lane]];
        mine = (slot < 0 || slot >= cap) ? -1 : slot;
        my_w = weights ? weights[i0 + lane] : 1.0f;
      }
      for (int j = 0; j < n; ++j) {  // n is the same on every lane: the shuffles see all 32
        const int64_t slot = __shfl_sync(0xffffffffu, mine, j);
        const float w = __shfl_sync(0xffffffffu, my_w, j);
        if (slot >= 0 && d < D) add_columns(base + slot * W, d, D, w, vec4, acc);
      }
    }
    for (int e = 0; e < 4; ++e) {
      if (d + e < D) dst[d + e] = acc[e] * scale;
    }
  }
}

at::Tensor grouped_pooled_gather_cuda(const at::Tensor& values, const at::Tensor& meta,
                                      const at::Tensor& slots, const at::Tensor& inverse,
                                      const at::Tensor& offsets,
                                      const std::optional<at::Tensor>& weights,
                                      const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                                      int64_t mode, int64_t batch_size, int64_t total_dim,
                                      bool check) {
  const char* op = "grouped_pooled_gather";
  check_group(values, meta, op);
  DEMB_CHECK_VALUE(mode == kPoolSum || mode == kPoolMean, op,
                   ": mode must be 0 (SUM) or 1 (MEAN), got ", mode);
  DEMB_CHECK_TYPE(slots.scalar_type() == at::kLong && slots.dim() == 1, op,
                  ": slots must be (u,) int64, got ", slots.sizes(), " ", slots.scalar_type());
  check_group_bags(inverse, offsets, weights, feature_tables, d_offsets, mode, batch_size, op);
  check_on_device(inverse, values.device(), "inverse", op);
  check_on_device(slots, values.device(), "slots", op);
  const at::cuda::CUDAGuard guard(values.device());
  const auto sl = slots.contiguous();
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const auto ft = feature_tables.contiguous();
  const auto dofs = d_offsets.contiguous();
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  if (check) {
    check_layout_cuda(values, meta, op);
    check_bags_cuda(meta, inv, off, ft, sl.numel(), op);
  }
  const int64_t num_bags = off.numel() - 1;
  // Columns of a feature whose bags are all empty are written too (zeros): no fill needed.
  auto out = at::empty({batch_size, total_dim}, values.options().dtype(at::kFloat));
  if (num_bags == 0 || total_dim == 0) return out.zero_();
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    pooled_kernel<E><<<blocks_for(num_bags), dim3(kWarp, kRowsPerBlock), 0,
                       at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        sl.data_ptr<int64_t>(), inv.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
        w.defined() ? w.data_ptr<float>() : nullptr, ft.data_ptr<int64_t>(),
        dofs.data_ptr<int64_t>(), num_bags, batch_size, total_dim, mode, out.data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace dynamicemb
