// grouped_pooled_gather on CUDA: one warp per bag.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_common.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- pooled gather: one warp per bag ----

template <typename E>
__global__ void pooled_kernel(const E* __restrict__ values, DeviceMeta meta,
                              const int64_t* __restrict__ slots, const int64_t* __restrict__ inverse,
                              const int64_t* __restrict__ offsets, const float* __restrict__ weights,
                              const int64_t* __restrict__ ft, const int64_t* __restrict__ dofs,
                              int64_t num_bags, int64_t B, int64_t total_dim, int64_t mode,
                              float* __restrict__ out) {
  const int64_t bag = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (bag >= num_bags) return;
  const int64_t f = bag / B, s = bag % B, t = ft[f];
  const int64_t D = meta.dim(t), W = meta.width(t), cap = meta.capacity(t);
  const E* base = values + meta.offset(t);
  const int64_t lo = offsets[bag], hi = offsets[bag + 1];
  const float scale = (mode == kPoolMean && hi > lo) ? 1.0f / float(hi - lo) : 1.0f;
  float* dst = out + s * total_dim + dofs[f];
  for (int64_t d = threadIdx.x; d < D; d += kWarp) {
    float acc = 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t slot = slots[inverse[i]];
      if (slot < 0 || slot >= cap) continue;
      const float w = weights ? weights[i] : 1.0f;
      acc += w * static_cast<float>(base[slot * W + d]);
    }
    dst[d] = acc * scale;
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
