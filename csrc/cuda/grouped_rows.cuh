// grouped_gather, grouped_scatter and grouped_init_rows on CUDA: one warp per row.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_common.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- gather / scatter: one warp per row ----

template <typename E>
__global__ void gather_kernel(const E* __restrict__ values, DeviceMeta meta,
                              const int64_t* __restrict__ tids, const int64_t* __restrict__ slots,
                              const int64_t* __restrict__ inverse, int64_t n, int64_t width,
                              float* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= n) return;
  const int64_t j = inverse != nullptr ? inverse[i] : i;
  const int64_t t = tids[j], s = slots[j];
  const bool ok = meta.valid(t, s);
  const int64_t W = ok ? meta.width(t) : 0;
  float* dst = out + i * width;
  if constexpr (sizeof(E) != 4) {
    const int64_t D = ok ? meta.dim(t) : 0;
    const int64_t L = ok ? logical_width<E>(W, D) : 0;
    const int64_t take = width < L ? width : L;
    const E* row = values + (ok ? meta.offset(t) + s * W : 0);
    const float* state = state_of(row, D);
    for (int64_t d = threadIdx.x; d < width; d += kWarp) {
      dst[d] = d >= take ? 0.0f : d < D ? static_cast<float>(row[d]) : state[d - D];
    }
    return;
  }
  const int64_t take = ok ? (width < W ? width : W) : 0;
  const float* src = reinterpret_cast<const float*>(ok ? values + meta.offset(t) + s * W : values);
  if ((take & 3) == 0 && (width & 3) == 0 && ((reinterpret_cast<uintptr_t>(src) |
                                               reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    // 16-byte loads and stores: a row of 128 floats is one pass of the warp.
    for (int64_t d = threadIdx.x * 4; d < width; d += kWarp * 4) {
      *reinterpret_cast<float4*>(dst + d) = d < take ? *reinterpret_cast<const float4*>(src + d)
                                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < width; d += kWarp) dst[d] = d < take ? src[d] : 0.0f;
}

template <typename E>
__global__ void scatter_kernel(E* __restrict__ values, DeviceMeta meta,
                               const int64_t* __restrict__ tids, const int64_t* __restrict__ slots,
                               int64_t n, const float* __restrict__ rows, int64_t R) {
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= n) return;
  const int64_t t = tids[i], s = slots[i];
  if (!meta.valid(t, s)) return;
  const int64_t W = meta.width(t), D = meta.dim(t);
  const int64_t L = logical_width<E>(W, D);
  const int64_t take = R < L ? R : L;
  E* dst = values + meta.offset(t) + s * W;
  float* state = state_of(dst, D);
  for (int64_t d = threadIdx.x; d < take; d += kWarp) {
    if (d < D) {
      dst[d] = to_row<E>(rows[i * R + d]);
    } else {
      state[d - D] = rows[i * R + d];
    }
  }
  if (threadIdx.x == 0 && emb_span<E>(D) > D) dst[D] = to_row<E>(0.0f);
}

at::Tensor grouped_gather_cuda(const at::Tensor& values, const at::Tensor& meta,
                               const at::Tensor& table_ids, const at::Tensor& slots, int64_t width,
                               bool check, const std::optional<at::Tensor>& inverse) {
  const char* op = "grouped_gather";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_gather_inverse(inverse, values.device(), op);
  DEMB_CHECK_VALUE(width >= 0, op, ": width must be >= 0, got ", width);
  const at::cuda::CUDAGuard guard(values.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const at::Tensor inv = inverse.has_value() ? inverse->contiguous() : at::Tensor();
  const int64_t u = sl.numel();
  if (check) {
    check_layout_cuda(values, meta, op);
    check_rows_cuda(meta, tid, sl, op);
    if (inv.defined() && inv.numel() > 0) {
      const bool bad = ((inv < 0) | (inv >= u)).any().item<bool>();
      DEMB_CHECK_INDEX(!bad, op, ": inverse out of range [0, ", u, ")");
    }
  }
  const int64_t n = inv.defined() ? inv.numel() : u;
  auto out = at::empty({n, width}, values.options().dtype(at::kFloat));
  if (n == 0 || width == 0) return out;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    gather_kernel<E><<<blocks_for(n), dim3(kWarp, kRowsPerBlock), 0,
                       at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(),
        inv.defined() ? inv.data_ptr<int64_t>() : nullptr, n, width, out.data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void grouped_scatter_cuda(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                          const at::Tensor& slots, const at::Tensor& rows, bool check) {
  const char* op = "grouped_scatter";
  check_group(values, meta, op);
  check_row_ids(table_ids, slots, values.device(), op);
  check_float_rows(rows, slots.numel(), values.device(), "rows", op);
  const at::cuda::CUDAGuard guard(values.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto r = rows.contiguous();
  const int64_t n = sl.numel();
  if (check) {
    check_layout_cuda(values, meta, op);
    check_rows_cuda(meta, tid, sl, op);
    if (n > 0) {
      const auto widths = logical_widths(values, meta).index_select(0, tid);
      const bool narrow = ((sl >= 0) & (widths > r.size(1))).any().item<bool>();
      DEMB_CHECK_VALUE(!narrow, op, ": rows have ", r.size(1),
                       " columns, fewer than a written table's row_width");
    }
  }
  if (n == 0) return;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    scatter_kernel<E><<<blocks_for(n), dim3(kWarp, kRowsPerBlock), 0,
                        at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), n, r.data_ptr<float>(), r.size(1));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---- new rows: a warp looks at 32 pairs, then writes the rows of those with a slot ----

/// Most pairs of a training step have no new row (their slot is -1 in the mask): each warp reads
/// the slots of 32 pairs at once (one coalesced load) and only the pairs with a slot cost a
/// row's writes, one pair after another, the warp's lanes over the row's columns.
template <typename E>
__global__ void init_rows_kernel(E* __restrict__ values, DeviceMeta meta,
                                 const int64_t* __restrict__ tids, const int64_t* __restrict__ slots,
                                 const int64_t* __restrict__ keys, const double* __restrict__ init,
                                 int64_t n, int64_t seed, const bool* __restrict__ only) {
  const int64_t base = (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y) * kWarp;
  const int64_t mine = base + threadIdx.x;
  long long t = -1, s = -1;
  if (mine < n && (only == nullptr || only[mine])) {
    s = slots[mine];
    if (s >= 0) t = tids[mine];
  }
  const bool ok = s >= 0 && meta.valid(t, s);
  unsigned todo = __ballot_sync(0xffffffffu, ok);
  while (todo != 0) {
    const int j = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t tj = __shfl_sync(0xffffffffu, t, j), sj = __shfl_sync(0xffffffffu, s, j);
    const int64_t key = keys[base + j];
    const int64_t W = meta.width(tj), D = meta.dim(tj);
    const int64_t L = logical_width<E>(W, D);
    const double* p = init + tj * kInitColumns;
    const uint64_t stream = init_stream(seed, tj, key);
    E* dst = values + meta.offset(tj) + sj * W;
    float* state = state_of(dst, D);
    const float fill = float(p[kInitState]);
    for (int64_t d = threadIdx.x; d < L; d += kWarp) {
      if (d < D) {
        dst[d] = to_row<E>(init_value(p, stream, key, d));
      } else {
        state[d - D] = fill;
      }
    }
    if (threadIdx.x == 0 && emb_span<E>(D) > D) dst[D] = to_row<E>(0.0f);
  }
}

void grouped_init_rows_cuda(at::Tensor& values, const at::Tensor& meta, const at::Tensor& table_ids,
                            const at::Tensor& slots, const at::Tensor& keys, const at::Tensor& init,
                            int64_t seed, bool check, const std::optional<at::Tensor>& only_in) {
  const char* op = "grouped_init_rows";
  const at::Tensor only =
      check_init_rows_args(values, meta, table_ids, slots, keys, init, only_in, op);
  const int64_t n = slots.numel();
  const at::cuda::CUDAGuard guard(values.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto k = keys.contiguous();
  const auto in = init.contiguous();
  if (check) {
    check_layout_cuda(values, meta, op);
    check_rows_cuda(meta, tid, sl, op);
    const auto modes = in.select(1, 0).cpu();
    const double* m = modes.data_ptr<double>();
    for (int64_t t = 0; t < modes.numel(); ++t) {
      DEMB_CHECK_VALUE(m[t] == double(int64_t(m[t])) && m[t] >= double(kInitConstant) &&
                           m[t] <= double(kInitTruncatedNormal),
                       op, ": init row ", t, " has no initializer mode (got ", m[t], ")");
    }
  }
  if (n == 0) return;
  dispatch_rows(values.scalar_type(), [&](auto tag) {
    using E = decltype(tag);
    const int64_t per_block = int64_t(kRowsPerBlock) * kWarp;
    init_rows_kernel<E><<<(n + per_block - 1) / per_block, dim3(kWarp, kRowsPerBlock), 0,
                          at::cuda::getCurrentCUDAStream()>>>(
        values.data_ptr<E>(), DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)},
        tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), k.data_ptr<int64_t>(),
        in.data_ptr<double>(), n, seed, only.defined() ? only.data_ptr<bool>() : nullptr);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace dynamicemb
