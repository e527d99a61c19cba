// grouped_update and grouped_reduce_update on CUDA: the fused optimizer updates.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_reduce.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- optimizer updates: one warp per row ----

/// Element ``d`` of an E row updated in float32 by ``step(x)`` and rounded back to E as ``r`` says.
template <typename E, typename Step>
__device__ inline void update_in_float(E* w, int64_t d, const RowRounding& r, Step step) {
  float x = static_cast<float>(w[d]);
  step(x);
  w[d] = round_update<E>(x, r, d);
}

template <typename E>
__global__ void update_kernel(E* __restrict__ values, DeviceMeta meta,
                              const int64_t* __restrict__ tids, const int64_t* __restrict__ slots,
                              const int64_t* __restrict__ keys,
                              const float* __restrict__ grads, int64_t n, int64_t G,
                              int64_t optimizer, UpdateParams p) {
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= n) return;
  const int64_t t = tids[i], s = slots[i];
  if (!meta.valid(t, s)) return;
  const int64_t D = meta.dim(t);
  E* w = values + meta.offset(t) + s * meta.width(t);
  float* m = state_of(w, D);
  const float* g = grads + i * G;
  const RowRounding r = row_rounding(p, t, keys, i);
  if (optimizer == kSgd) {
    for (int64_t d = threadIdx.x; d < D; d += kWarp)
      update_in_float(w, d, r, [&](float& x) { sgd_element(x, g[d], p); });
  } else if (optimizer == kAdagrad) {
    for (int64_t d = threadIdx.x; d < D; d += kWarp)
      update_in_float(w, d, r, [&](float& x) { adagrad_element(x, m[d], g[d], p); });
  } else if (optimizer == kRowwiseAdagrad) {
    float local = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += kWarp)
      local += rowwise_square(static_cast<float>(w[d]), g[d], p);
    const float sum_sq = warp_sum(local);
    const float new_m = rowwise_accumulator(m[0], sum_sq, D);
    for (int64_t d = threadIdx.x; d < D; d += kWarp)
      update_in_float(w, d, r, [&](float& x) { rowwise_element(x, g[d], new_m, p); });
    __syncwarp();
    if (threadIdx.x == 0) m[0] = new_m;
  } else {
    float* v = m + D;
    for (int64_t d = threadIdx.x; d < D; d += kWarp)
      update_in_float(w, d, r, [&](float& x) { adam_element(x, m[d], v[d], g[d], p); });
  }
}

/// grouped_reduce_update's last pass for the element-wise optimizers: each key's chunk partials
/// summed (in chunk order, as key_sums_kernel does) and its row updated at once, so the (u, width)
/// gradient is never written; the rows equal key_sums_kernel then update_kernel.
/// With ``fused`` the keys of one chunk were updated by chunk_sums_kernel and are skipped here:
/// each warp looks at 32 keys at once (one coalesced read of their chunk counts) and updates the
/// ones left, one key at a time with the whole warp, so the pass costs little when few keys
/// span several chunks (a power-law batch's hot keys).
template <typename E>
__global__ void key_update_kernel(E* __restrict__ values, DeviceMeta meta,
                                  const int64_t* __restrict__ tids, const int64_t* __restrict__ slots,
                                  const int64_t* __restrict__ keys, const float* __restrict__ partial,
                                  const int64_t* __restrict__ chunk_start, int64_t num_unique,
                                  int64_t width, int64_t optimizer, UpdateParams p, bool fused) {
  const int64_t first = (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y) * kWarp;
  if (first >= num_unique) return;  // the whole warp: first is the same for its lanes
  const int64_t mine = first + threadIdx.x;
  bool left = false;
  if (mine < num_unique) left = !(fused && chunk_start[mine + 1] - chunk_start[mine] == 1);
  unsigned todo = __ballot_sync(0xffffffffu, left);
  while (todo != 0) {
    const int lane = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t k = first + lane;
    const int64_t t = tids[k], s = slots[k];
    if (!meta.valid(t, s)) continue;
    const int64_t c0 = chunk_start[k], c1 = chunk_start[k + 1];
    const int64_t D = meta.dim(t);
    E* w = values + meta.offset(t) + s * meta.width(t);
    const RowRounding r = row_rounding(p, t, keys, k);
    for (int64_t d = threadIdx.x; d < D; d += kWarp) {
      float g = 0.0f;
      for (int64_t c = c0; c < c1; ++c) g += partial[c * width + d];
      update_element(w, D, d, g, optimizer, p, r);
    }
  }
}

void check_optimizer_args(int64_t optimizer, int64_t weight_decay_mode, int64_t step, const char* op) {
  DEMB_CHECK_VALUE(optimizer >= kSgd && optimizer <= kAdam, op,
                   ": optimizer must be 0 (SGD), 1 (ADAGRAD), 2 (ROWWISE_ADAGRAD) or 3 (ADAM), got ",
                   optimizer);
  DEMB_CHECK_VALUE(weight_decay_mode >= 0 && weight_decay_mode <= 2, op,
                   ": weight_decay_mode must be 0 (NONE), 1 (L2) or 2 (DECOUPLE), got ",
                   weight_decay_mode);
  DEMB_CHECK_VALUE(optimizer != kAdam || step >= 1, op,
                   ": step must be >= 1 for ADAM (bias correction), got ", step);
}

/// check=true: every table's row holds its dim and optimizer state (reads meta back).
void check_widths_cuda(const at::Tensor& values, const at::Tensor& meta, int64_t optimizer,
                       const char* op) {
  check_layout_cuda(values, meta, op);
  const auto m = meta.cpu();
  const int64_t* p = m.data_ptr<int64_t>();
  for (int64_t t = 0; t < m.size(0); ++t) {
    const int64_t dim = p[t * kMetaColumns + kMetaDim];
    const int64_t stored = p[t * kMetaColumns + kMetaWidth];
    const int64_t w =
        values.element_size() == 4 ? stored : logical_width<at::Half>(stored, dim);
    const int64_t need = dim + state_width(optimizer, dim);
    DEMB_CHECK_VALUE(w >= need, op, ": table ", t, "'s row_width ", w, " is too small for dim ",
                     dim, " and its optimizer state (needs ", need, ")");
  }
}

void launch_update(at::Tensor& values, const at::Tensor& meta, const at::Tensor& tid,
                   const at::Tensor& sl, const int64_t* keys, const at::Tensor& g,
                   int64_t optimizer, const UpdateParams& p) {
  const int64_t n = sl.numel();
  if (n == 0) return;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    update_kernel<E><<<blocks_for(n), dim3(kWarp, kRowsPerBlock), 0,
                       at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), keys, g.data_ptr<float>(), n, g.size(1),
        optimizer, p);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void grouped_update_cuda(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                         const at::Tensor& slots, const at::Tensor& grads, int64_t optimizer,
                         double lr, double eps, double beta1, double beta2, double weight_decay,
                         int64_t weight_decay_mode, int64_t step, bool check,
                         int64_t rounding_seed, const std::optional<at::Tensor>& keys) {
  const char* op = "grouped_update";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_float_rows(grads, slots.numel(), values.device(), "grads", op);
  check_update_keys(keys, slots.numel(), rounding_seed, values.device(), op);
  check_optimizer_args(optimizer, weight_decay_mode, step, op);
  const at::cuda::CUDAGuard guard(values.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto g = grads.contiguous();
  if (check) {
    check_widths_cuda(values, meta, optimizer, op);
    check_rows_cuda(meta, tid, sl, op);
    if (sl.numel() > 0) {
      const auto dims = meta.select(1, kMetaDim).index_select(0, tid.clamp(0, meta.size(0) - 1));
      const bool narrow = ((sl >= 0) & (dims > g.size(1))).any().item<bool>();
      DEMB_CHECK_VALUE(!narrow, op, ": grads have ", g.size(1), " columns, fewer than a table's dim");
    }
  }
  const at::Tensor k = keys.has_value() ? keys->contiguous() : at::Tensor();
  launch_update(values, meta, tid, sl, k.defined() ? k.data_ptr<int64_t>() : nullptr, g, optimizer,
                make_params(lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step,
                            rounding_seed));
}

// The GPU form of the fused op: the chunk partials, then one warp per key sums them and updates
// its row (row-wise Adagrad, which needs a row's whole gradient first, goes through the gradient).
void grouped_reduce_update_cuda(at::Tensor& values, const at::Tensor& meta,
                                const at::Tensor& table_ids, const at::Tensor& slots,
                                const at::Tensor& grad_out, const at::Tensor& inverse,
                                const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                                const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                                int64_t mode, int64_t batch_size, int64_t max_dim,
                                int64_t optimizer, double lr, double eps, double beta1,
                                double beta2, double weight_decay, int64_t weight_decay_mode,
                                int64_t step, bool check, const std::optional<at::Tensor>& order,
                                const std::optional<at::Tensor>& key_counts,
                                int64_t rounding_seed, const std::optional<at::Tensor>& keys) {
  const char* op = "grouped_reduce_update";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_update_keys(keys, slots.numel(), rounding_seed, values.device(), op);
  check_optimizer_args(optimizer, weight_decay_mode, step, op);
  const at::cuda::CUDAGuard guard(values.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const at::Tensor kc = keys.has_value() ? keys->contiguous() : at::Tensor();
  const int64_t* k_p = kc.defined() ? kc.data_ptr<int64_t>() : nullptr;
  if (check) {
    check_widths_cuda(values, meta, optimizer, op);
    check_rows_cuda(meta, tid, sl, op);
  }
  DEMB_CHECK_VALUE(max_dim >= 0, op, ": max_dim must be >= 0, got ", max_dim);
  const UpdateParams p =
      make_params(lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step, rounding_seed);
  const int64_t u = sl.numel();
  // Row-wise Adagrad needs each row's whole gradient before its update: no fusion for it. The
  // chunk kernel's fused update writes float32 rows only: half-precision rows update in
  // key_update_kernel.
  const bool fuse = optimizer != kRowwiseAdagrad && values.scalar_type() == at::kFloat;
  const FusedUpdate fused{fuse ? values.data_ptr<float>() : nullptr, tid.data_ptr<int64_t>(),
                          sl.data_ptr<int64_t>(), optimizer, p};
  const Partials parts =
      reduce_partials(grad_out, meta, inverse, offsets, weights, feature_tables, d_offsets, mode,
                      batch_size, u, max_dim, check, op, order, key_counts, fused,
                      tid.data_ptr<int64_t>());
  if (parts.empty || optimizer == kRowwiseAdagrad) {
    // Row-wise Adagrad needs each row's sum of squares before its update: the gradient first.
    at::Tensor grads = at::zeros({u, max_dim}, grad_out.options());
    if (!parts.empty) {
      key_sums_kernel<<<blocks_for(u), dim3(kWarp, kRowsPerBlock), 0,
                        at::cuda::getCurrentCUDAStream()>>>(
          parts.partial.data_ptr<float>(), parts.chunk_start.data_ptr<int64_t>(), u, max_dim,
          grads.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    launch_update(values, meta, tid, sl, k_p, grads, optimizer, p);
    return;
  }
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    key_update_kernel<E><<<blocks_for((u + kWarp - 1) / kWarp), dim3(kWarp, kRowsPerBlock), 0,
                           at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), k_p, parts.partial.data_ptr<float>(),
        parts.chunk_start.data_ptr<int64_t>(), u, max_dim, optimizer, p, fuse);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace dynamicemb
