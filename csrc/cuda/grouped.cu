// CUDA kernels of the grouped value ops; same schemas (csrc/ops.cpp, "grouped" section) and the
// same semantics as csrc/cpu/grouped.cpp. One warp per row or bag (lanes stride over the dim); the
// per-table metadata (T, 4) is read from device memory by each warp, so every op is one launch
// (or a fixed few) whatever the number of tables.
//
// check=true runs the data checks first (one device synchronisation); with check=false the kernels
// skip rows whose table id or slot is out of range and trust offsets and inverse.
//
// Row element type E (grouped.h): the kernels are templated on the values' dtype (float, or a
// 2-byte type storing the embedding beside float32 state); gather and scatter move logical float32
// rows, the updates compute in float32 and round the embedding back to E.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "dynamicemb/check.h"
#include "dynamicemb/grouped.h"
#include "dynamicemb/grouped_checks.h"

namespace dynamicemb {
namespace {

using namespace grouped;

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;
constexpr int64_t kChunk = 64;

inline int64_t blocks_for(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct DeviceMeta {
  const int64_t* m;
  int64_t T;
  __device__ int64_t offset(int64_t t) const { return m[t * kMetaColumns + kMetaOffset]; }
  __device__ int64_t width(int64_t t) const { return m[t * kMetaColumns + kMetaWidth]; }
  __device__ int64_t capacity(int64_t t) const { return m[t * kMetaColumns + kMetaCapacity]; }
  __device__ int64_t dim(int64_t t) const { return m[t * kMetaColumns + kMetaDim]; }
  __device__ bool valid(int64_t t, int64_t s) const {
    return t >= 0 && t < T && s >= 0 && s < capacity(t);
  }
};

// ---- data checks (check=true): one readback of a small flags tensor ----

/// Raises IndexError when a (table id, slot) pair is outside the group (slots < 0 are allowed).
void check_rows_cuda(const at::Tensor& meta, const at::Tensor& tids, const at::Tensor& slots,
                     const char* op) {
  if (tids.numel() == 0) return;
  const int64_t T = meta.size(0);
  const auto bad_tid = (tids < 0) | (tids >= T);
  const auto caps = meta.select(1, kMetaCapacity).index_select(0, tids.clamp(0, T - 1));
  const auto bad_slot = slots >= caps;
  const auto flags = at::stack({bad_tid.any(), bad_slot.any()}).cpu();
  const bool* f = flags.data_ptr<bool>();
  if (f[0]) {
    const int64_t i = bad_tid.nonzero().select(0, 0).item<int64_t>();
    DEMB_CHECK_INDEX(false, op, ": table_ids[", i, "]=", tids.select(0, i).item<int64_t>(),
                     " out of range [0, ", T, ")");
  }
  if (f[1]) {
    const int64_t i = bad_slot.nonzero().select(0, 0).item<int64_t>();
    DEMB_CHECK_INDEX(false, op, ": slots[", i, "]=", slots.select(0, i).item<int64_t>(),
                     " out of range for table ", tids.select(0, i).item<int64_t>(), " (capacity ",
                     caps.select(0, i).item<int64_t>(), ")");
  }
}

/// Raises unless offsets run from 0 to n without decreasing, inverse lies in [0, u) and every
/// feature's table is in the group.
void check_bags_cuda(const at::Tensor& meta, const at::Tensor& inverse, const at::Tensor& offsets,
                     const at::Tensor& feature_tables, int64_t u, const char* op) {
  const int64_t n = inverse.numel(), T = meta.size(0);
  const auto zero = at::zeros({}, offsets.options().dtype(at::kBool));
  const auto bad_order = offsets.numel() > 1 ? (offsets.narrow(0, 1, offsets.numel() - 1) <
                                                offsets.narrow(0, 0, offsets.numel() - 1)).any()
                                             : zero;
  const auto bad_inv = n > 0 ? ((inverse < 0) | (inverse >= u)).any() : zero;
  const auto bad_ft = feature_tables.numel() > 0
                          ? ((feature_tables < 0) | (feature_tables >= T)).any().to(offsets.device())
                          : zero;
  const auto ends = at::stack({offsets.select(0, 0), offsets.select(0, offsets.numel() - 1)});
  const auto flags = at::cat({at::stack({bad_order, bad_inv, bad_ft}).to(at::kLong), ends}).cpu();
  const int64_t* f = flags.data_ptr<int64_t>();
  DEMB_CHECK_VALUE(f[3] == 0 && f[4] == n, op, ": offsets must start at 0 and end at n=", n,
                   ", got [", f[3], ", ...,", f[4], "]");
  DEMB_CHECK_VALUE(!f[0], op, ": offsets must be non-decreasing");
  DEMB_CHECK_INDEX(!f[1], op, ": inverse out of range [0, ", u, ")");
  DEMB_CHECK_INDEX(!f[2], op, ": feature_tables out of range [0, ", T, ")");
}

/// check=true on a half-precision buffer: every table's rows keep their float32 state aligned.
void check_layout_cuda(const at::Tensor& values, const at::Tensor& meta, const char* op) {
  if (values.element_size() == 4) return;
  const auto m = meta.cpu();
  const int64_t* p = m.data_ptr<int64_t>();
  for (int64_t t = 0; t < m.size(0); ++t) {
    const int64_t off = p[t * kMetaColumns + kMetaOffset], w = p[t * kMetaColumns + kMetaWidth];
    const int64_t cap = p[t * kMetaColumns + kMetaCapacity], d = p[t * kMetaColumns + kMetaDim];
    DEMB_CHECK_VALUE(row_layout_ok<at::Half>(off, w, d), op, ": meta row ", t, " = [", off, ", ",
                     w, ", ", cap, ", ", d, "] is not a half-precision row layout (even offset "
                     "and width, the embedding padded to an even dim)");
  }
}

/// (T,) logical (float32) row widths of meta's tables, on meta's device.
at::Tensor logical_widths(const at::Tensor& values, const at::Tensor& meta) {
  const auto widths = meta.select(1, kMetaWidth);
  if (values.element_size() == 4) return widths;
  const auto dims = meta.select(1, kMetaDim);
  const auto span = (dims + 1).div(2, "floor") * 2;
  return dims + (widths - span).div(2, "floor");
}

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

// ---- reduction: deterministic two passes over the key-sorted positions (as lookup.cu's) ----

__global__ void bag_of_kernel(const int64_t* __restrict__ offsets, int64_t num_bags,
                              int64_t* __restrict__ bag_of) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= num_bags) return;
  for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of[i] = b;
}

/// Chunks of each key (its positions in runs of kChunk), and the zero that starts the prefix sums
/// of chunks and, when given, of positions (``starts0``).
__global__ void chunk_counts_kernel(const int64_t* __restrict__ counts, int64_t num_unique,
                                    int64_t* __restrict__ chunks, int64_t* __restrict__ chunk0,
                                    int64_t* __restrict__ starts0) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k == 0) {
    *chunk0 = 0;
    if (starts0 != nullptr) *starts0 = 0;
  }
  if (k < num_unique) chunks[k] = (counts[k] + (kChunk - 1)) / kChunk;
}

/// Each chunk of positions' key and span (one thread per key writes its chunks' entries):
/// ``chunk_key[c] = k`` and ``chunk_span[c] = lo << 8 | len << 1 | (k has this chunk only)``, its
/// positions being ``[lo, lo + len)`` of the key-grouped order; chunk ids past the real count (up to
/// the grid's bound ``max_chunks``) get key -1. The chunk pass then reads two words at its own
/// index (coalesced, both at once) instead of following key -> chunk_start, starts.
__global__ void chunk_key_kernel(const int64_t* __restrict__ chunk_start,
                                 const int64_t* __restrict__ starts, int64_t num_unique,
                                 int64_t max_chunks, int64_t* __restrict__ chunk_key,
                                 int64_t* __restrict__ chunk_span) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < num_unique) {
    const int64_t c0 = chunk_start[k], c1 = chunk_start[k + 1];
    const int64_t s0 = starts[k], s1 = starts[k + 1];
    const int64_t only = c1 - c0 == 1 ? 1 : 0;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = s0 + (c - c0) * kChunk;
      const int64_t len = s1 - lo < kChunk ? s1 - lo : kChunk;
      chunk_key[c] = k;
      chunk_span[c] = (lo << 8) | (len << 1) | only;
    }
  }
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = chunk_start[num_unique] + k; c < max_chunks; c += stride) chunk_key[c] = -1;
}

__device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

/// The element-wise optimizers on element ``d`` of a row ``w`` of dim ``D`` (its float32 state
/// after the embedding, grouped.h), computed in float32 and rounded back to the row type E as
/// ``r`` says.
template <typename E>
__device__ inline void update_element(E* w, int64_t D, int64_t d, float g, int64_t optimizer,
                                      const UpdateParams& p, const RowRounding& r = {}) {
  float* m = state_of(w, D);
  float x = static_cast<float>(w[d]);
  if (optimizer == kSgd) {
    sgd_element(x, g, p);
  } else if (optimizer == kAdagrad) {
    adagrad_element(x, m[d], g, p);
  } else {
    adam_element(x, m[d], m[D + d], g, p);
  }
  w[d] = round_update<E>(x, r, d);
}

/// The fused update of grouped_reduce_update for the chunk kernel: a key whose positions fit in one
/// chunk (most keys of a power-law batch) is updated there, from the chunk's sum, instead of
/// writing a partial for key_update_kernel to read back. ``values`` null: no fusion.
struct FusedUpdate {
  float* values;
  const int64_t* tids;
  const int64_t* slots;
  int64_t optimizer;
  UpdateParams p;
};

/// The gradient row of position ``i`` (its bag's slice for a pooled output) and the scale it is
/// summed with (its weight, divided by its bag's length for MEAN). A sequence output (not
/// ``kPooled``) reads row ``i`` and needs no bag.
template <bool kPooled>
__device__ inline const float* grad_source(const float* grad, int64_t gs0, int64_t gs1, int64_t i,
                                           const int64_t* __restrict__ bag_of,
                                           const int64_t* __restrict__ offsets,
                                           const float* __restrict__ weights,
                                           const int64_t* __restrict__ dofs, int64_t B,
                                           int64_t mode, float& scale) {
  scale = weights ? weights[i] : 1.0f;
  if constexpr (kPooled) {
    const int64_t bag = bag_of[i];
    if (mode == kPoolMean) scale /= float(offsets[bag + 1] - offsets[bag]);
    return grad + (bag % B) * gs0 + dofs[bag / B] * gs1;
  } else {
    return grad + i * gs0;
  }
}

/// ``kLanes`` lanes (a warp, or a half-warp: two chunks a warp, whose dependent loads overlap) per
/// chunk of up to kChunk positions of one key: the chunk's sum, in position order. The chunk's key
/// and span come from chunk_key_kernel (key -1: past the last chunk).
/// With ``vec`` (width a multiple of 4, grad_out's columns adjacent or all one value) each lane
/// sums 4 adjacent columns with 16-byte loads (or one load, broadcast), so a row of dim <= 128
/// takes one pass over the chunk's positions.
/// grad_out is read through its strides (gs0, gs1): an expanded gradient needs no copy.
/// The key's dim comes from its table id (``key_tids``) when given, else from its first
/// position's feature (``bag_of``, ``ft``); a sequence output (``kPooled`` false) with key table
/// ids reads no bag at all.
/// With ``fused.values`` a key's only chunk updates the key's row directly; the arithmetic is
/// key_update_kernel's (``0 + sum``, then the same element update), so the rows are the same.
template <bool kPooled, int kLanes>
__global__ void chunk_sums_kernel(const float* __restrict__ grad, int64_t gs0, int64_t gs1,
                                  DeviceMeta meta, const int64_t* __restrict__ perm,
                                  const int64_t* __restrict__ chunk_key,
                                  const int64_t* __restrict__ chunk_span,
                                  const int64_t* __restrict__ key_tids,
                                  const int64_t* __restrict__ bag_of, const int64_t* __restrict__ offsets,
                                  const float* __restrict__ weights, const int64_t* __restrict__ ft,
                                  const int64_t* __restrict__ dofs, int64_t B,
                                  int64_t max_chunks, int64_t width, int64_t mode, bool vec,
                                  float* __restrict__ partial, FusedUpdate fused) {
  constexpr int kPerWarp = kWarp / kLanes;
  const int lane = int(threadIdx.x) % kLanes;
  const int64_t c =
      (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y) * kPerWarp + threadIdx.x / kLanes;
  if (c >= max_chunks) return;
  const int64_t k = chunk_key[c];
  const int64_t span = chunk_span[c];  // read with the key (unset past the last chunk: unused)
  if (k < 0) return;
  const int64_t lo = span >> 8;
  const int64_t hi = lo + ((span >> 1) & 127);
  const bool only_chunk = (span & 1) != 0;
  int64_t D = 0;
  if (key_tids != nullptr) {
    const int64_t t = key_tids[k];
    D = t >= 0 && t < meta.T ? meta.dim(t) : 0;
  } else {
    D = meta.dim(ft[bag_of[perm[lo]] / B]);
  }
  float* out = partial + c * width;
  // The key's row when this chunk is its only one (fused update), else null (write the partial).
  float* row = nullptr;
  int64_t row_dim = 0;
  if (fused.values != nullptr && only_chunk) {
    const int64_t t = fused.tids[k], s = fused.slots[k];
    if (!meta.valid(t, s)) return;  // no row to update (key_update_kernel skips it as well)
    row_dim = meta.dim(t);
    row = fused.values + meta.offset(t) + s * meta.width(t);
  }
  if (vec) {
    for (int64_t d = lane * 4; d < width; d += kLanes * 4) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (d < D) {
        for (int64_t j = lo; j < hi; ++j) {
          float scale;
          const float* src = grad_source<kPooled>(grad, gs0, gs1, perm[j], bag_of, offsets,
                                                  weights, dofs, B, mode, scale) +
                             d * gs1;
          float4 g;
          if (gs1 == 0) {
            // an expanded gradient: one value for the whole row
            const float v = src[0];
            g = make_float4(v, d + 1 < D ? v : 0.0f, d + 2 < D ? v : 0.0f, d + 3 < D ? v : 0.0f);
          } else if (d + 3 < D && aligned16(src)) {
            g = *reinterpret_cast<const float4*>(src);
          } else {
            g.x = src[0];
            g.y = d + 1 < D ? src[1] : 0.0f;
            g.z = d + 2 < D ? src[2] : 0.0f;
            g.w = d + 3 < D ? src[3] : 0.0f;
          }
          acc.x += scale * g.x;
          acc.y += scale * g.y;
          acc.z += scale * g.z;
          acc.w += scale * g.w;
        }
      }
      if (row != nullptr) {
        const float sums[4] = {acc.x, acc.y, acc.z, acc.w};
        for (int e = 0; e < 4; ++e) {
          if (d + e < row_dim) {
            float g = 0.0f;
            g += sums[e];
            update_element(row, row_dim, d + e, g, fused.optimizer, fused.p);
          }
        }
      } else {
        *reinterpret_cast<float4*>(out + d) = acc;
      }
    }
    return;
  }
  for (int64_t d = lane; d < width; d += kLanes) {
    float acc = 0.0f;
    if (d < D) {
      for (int64_t j = lo; j < hi; ++j) {
        float scale;
        const float* src = grad_source<kPooled>(grad, gs0, gs1, perm[j], bag_of, offsets, weights,
                                                dofs, B, mode, scale);
        acc += scale * src[d * gs1];
      }
    }
    if (row != nullptr) {
      if (d < row_dim) {
        float g = 0.0f;
        g += acc;
        update_element(row, row_dim, d, g, fused.optimizer, fused.p);
      }
    } else {
      out[d] = acc;
    }
  }
}

__global__ void key_sums_kernel(const float* __restrict__ partial,
                                const int64_t* __restrict__ chunk_start, int64_t num_unique,
                                int64_t width, float* __restrict__ out) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (k >= num_unique) return;
  for (int64_t d = threadIdx.x; d < width; d += kWarp) {
    float acc = 0.0f;
    for (int64_t c = chunk_start[k]; c < chunk_start[k + 1]; ++c) acc += partial[c * width + d];
    out[k * width + d] = acc;
  }
}

/// The per-chunk partial sums of a reduction and where each key's chunks start.
struct Partials {
  at::Tensor partial;      // (chunks, width)
  at::Tensor chunk_start;  // (u + 1,)
  bool empty;              // nothing to sum (n, u or width is 0)
};

Partials reduce_partials(const at::Tensor& grad_out, const at::Tensor& meta,
                         const at::Tensor& inverse, const at::Tensor& offsets,
                         const std::optional<at::Tensor>& weights, const at::Tensor& feature_tables,
                         const at::Tensor& d_offsets, int64_t mode, int64_t batch_size,
                         int64_t num_unique, int64_t width, bool check, const char* op,
                         const std::optional<at::Tensor>& order = std::nullopt,
                         const std::optional<at::Tensor>& key_counts = std::nullopt,
                         const FusedUpdate& fused = FusedUpdate{},
                         const int64_t* key_tids = nullptr) {
  check_meta(meta, grad_out.device(), op);
  check_group_bags(inverse, offsets, weights, feature_tables, d_offsets, mode, batch_size, op);
  check_on_device(inverse, grad_out.device(), "inverse", op);
  DEMB_CHECK_VALUE(num_unique >= 0 && width >= 0, op, ": num_unique and width must be >= 0");
  DEMB_CHECK_TYPE(grad_out.scalar_type() == at::kFloat, op, ": grad_out must be float32, got ",
                  grad_out.scalar_type());
  DEMB_CHECK_VALUE(grad_out.dim() == 2, op, ": grad_out must be 2-D, got ", grad_out.sizes());
  check_key_order(order, key_counts, inverse.numel(), num_unique, grad_out.device(), op);
  const at::cuda::CUDAGuard guard(grad_out.device());
  // Read through its strides: the gradient of a sum is an expanded scalar (no copy to make).
  const auto& g = grad_out;
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const auto ft = feature_tables.contiguous();
  const auto dofs = d_offsets.contiguous();
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  if (mode == kPoolNone) {
    DEMB_CHECK_VALUE(g.size(0) == inv.numel(), op, ": grad_out must have one row per index (",
                     inv.numel(), "), got ", g.sizes());
  } else {
    DEMB_CHECK_VALUE(g.size(0) == batch_size, op, ": grad_out must have B=", batch_size,
                     " rows, got ", g.sizes());
  }
  if (check) {
    check_bags_cuda(meta, inv, off, ft, num_unique, op);
    if (ft.numel() > 0) {
      const auto dims = meta.select(1, kMetaDim).index_select(0, ft);
      const int64_t widest = dims.max().item<int64_t>();
      DEMB_CHECK_VALUE(widest <= width, op, ": width ", width, " is below a table's dim ", widest);
    }
  }
  const int64_t n = inv.numel(), num_bags = off.numel() - 1;
  if (n == 0 || num_unique == 0 || width == 0) return {at::Tensor(), at::Tensor(), true};
  auto stream = at::cuda::getCurrentCUDAStream();
  at::Tensor perm, starts, counts;
  if (order.has_value()) {
    // The dedup's sort already grouped the positions by key (each key's in input order): the
    // stable sort below would give the same permutation. starts[0] = 0 is written by
    // chunk_counts_kernel below.
    perm = order->contiguous();
    counts = key_counts->contiguous();
    starts = at::empty({num_unique + 1}, inv.options());
    auto tail = starts.narrow(0, 1, num_unique);
    at::cumsum_out(tail, counts, 0);
  } else {
    // Stable sort of the positions by key; 32-bit keys halve the radix passes of 64-bit ones.
    const bool narrow = num_unique < std::numeric_limits<int32_t>::max();
    const auto sorted = at::sort(narrow ? inv.to(at::kInt) : inv, /*stable=*/true, /*dim=*/0,
                                 /*descending=*/false);
    const auto& sorted_keys = std::get<0>(sorted);
    perm = std::get<1>(sorted).contiguous();
    starts = at::searchsorted(sorted_keys, at::arange(num_unique + 1, sorted_keys.options()));
    counts = starts.narrow(0, 1, num_unique) - starts.narrow(0, 0, num_unique);
  }
  const int threads = 256;
  auto chunk_start = at::empty({num_unique + 1}, inv.options());
  auto chunks = at::empty({num_unique}, inv.options());
  chunk_counts_kernel<<<(num_unique + threads - 1) / threads, threads, 0, stream>>>(
      counts.data_ptr<int64_t>(), num_unique, chunks.data_ptr<int64_t>(),
      chunk_start.data_ptr<int64_t>(), order.has_value() ? starts.data_ptr<int64_t>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto chunk_tail = chunk_start.narrow(0, 1, num_unique);
  at::cumsum_out(chunk_tail, chunks, 0);
  // Every key has at least one position, so chunks <= n / kChunk + u; the grid covers that
  // bound and chunk ids past the real count find no key (chunk_key is -1 there).
  const int64_t max_chunks = n / kChunk + num_unique;
  auto chunk_key = at::empty({max_chunks}, inv.options());
  auto chunk_span = at::empty({max_chunks}, inv.options());
  auto partial = at::empty({max_chunks, width}, g.options());
  // The bag of each position: pooled outputs read the gradient by bag; a sequence output needs
  // it only for the keys' dims when their table ids are not given.
  const bool pooled = mode != kPoolNone;
  at::Tensor bag_of;
  if (pooled || key_tids == nullptr) {
    bag_of = at::empty({n}, inv.options());
    bag_of_kernel<<<(num_bags + threads - 1) / threads, threads, 0, stream>>>(
        off.data_ptr<int64_t>(), num_bags, bag_of.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  chunk_key_kernel<<<(num_unique + threads - 1) / threads, threads, 0, stream>>>(
      chunk_start.data_ptr<int64_t>(), starts.data_ptr<int64_t>(), num_unique, max_chunks,
      chunk_key.data_ptr<int64_t>(), chunk_span.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // The real number of chunks stays on the device (chunk_start[u]); chunks past it have key -1.
  // 4 columns a lane when a row's columns are adjacent, or all one value (an expanded gradient)
  const bool vec = width % 4 == 0 && (g.stride(1) == 1 || g.stride(1) == 0);
  // A row of <= 128 columns takes a half-warp two 16-byte passes: two chunks a warp, so twice
  // the chunks' dependent loads (key, table, slot, row) are in flight.
  const bool half = vec && width <= 128;
  const auto launch = [&](auto kernel, int per_warp) {
    const int64_t per_block = int64_t(kRowsPerBlock) * per_warp;
    kernel<<<(max_chunks + per_block - 1) / per_block, dim3(kWarp, kRowsPerBlock), 0, stream>>>(
        g.data_ptr<float>(), g.stride(0), g.stride(1),
        DeviceMeta{meta.data_ptr<int64_t>(), meta.size(0)}, perm.data_ptr<int64_t>(),
        chunk_key.data_ptr<int64_t>(), chunk_span.data_ptr<int64_t>(), key_tids,
        bag_of.defined() ? bag_of.data_ptr<int64_t>() : nullptr, off.data_ptr<int64_t>(),
        w.defined() ? w.data_ptr<float>() : nullptr, ft.data_ptr<int64_t>(),
        dofs.data_ptr<int64_t>(), batch_size, max_chunks, width, mode, vec,
        partial.data_ptr<float>(), fused);
  };
  if (pooled) {
    if (half) {
      launch(chunk_sums_kernel<true, kWarp / 2>, 2);
    } else {
      launch(chunk_sums_kernel<true, kWarp>, 1);
    }
  } else if (half) {
    launch(chunk_sums_kernel<false, kWarp / 2>, 2);
  } else {
    launch(chunk_sums_kernel<false, kWarp>, 1);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {partial, chunk_start, false};
}

at::Tensor reduce_cuda(const at::Tensor& grad_out, const at::Tensor& meta, const at::Tensor& inverse,
                       const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                       const at::Tensor& feature_tables, const at::Tensor& d_offsets, int64_t mode,
                       int64_t batch_size, int64_t num_unique, int64_t width, bool check,
                       const char* op) {
  const Partials parts = reduce_partials(grad_out, meta, inverse, offsets, weights, feature_tables,
                                         d_offsets, mode, batch_size, num_unique, width, check, op);
  auto out = at::empty({num_unique, width}, grad_out.options());
  if (parts.empty) return out.zero_();
  key_sums_kernel<<<blocks_for(num_unique), dim3(kWarp, kRowsPerBlock), 0,
                    at::cuda::getCurrentCUDAStream()>>>(
      parts.partial.data_ptr<float>(), parts.chunk_start.data_ptr<int64_t>(), num_unique, width,
      out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor grouped_reduce_grads_cuda(const at::Tensor& grad_out, const at::Tensor& meta,
                                     const at::Tensor& inverse, const at::Tensor& offsets,
                                     const std::optional<at::Tensor>& weights,
                                     const at::Tensor& feature_tables, const at::Tensor& d_offsets,
                                     int64_t mode, int64_t batch_size, int64_t num_unique,
                                     int64_t width, bool check) {
  return reduce_cuda(grad_out, meta, inverse, offsets, weights, feature_tables, d_offsets, mode,
                     batch_size, num_unique, width, check, "grouped_reduce_grads");
}

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

// ---- segmented unique: one stable radix sort of a (table id, key) word, one readback ----

using UniqueResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The sort word of a pair: the key with its table id mixed in (a bijection of the key for each
// table; table 0's word is the key itself). Two different pairs share a word only when their
// tables differ and their keys differ by exactly the two tables' mixes.
constexpr uint64_t kTableMix = 0x9E3779B97F4A7C15ULL;
constexpr int kSharedTables = 256;
constexpr int kUniqueThreads = 256;
// The unique's one readback: [per-table counts (T), the caller's numbers (E), u, clash]; the
// counts and numbers first, so the host's answer is a prefix of it (outputs start at offset 0).
// bag_unique's E = 3: the offsets check's numbers.
constexpr int64_t kCheckNumbers = 3;

inline int64_t unique_blocks(int64_t n) { return (n + kUniqueThreads - 1) / kUniqueThreads; }

__device__ inline int64_t pair_word(int64_t key, int64_t t) {
  return static_cast<int64_t>(static_cast<uint64_t>(key) ^ (static_cast<uint64_t>(t) * kTableMix));
}

/// One thread per sorted position: the inverse of its input position, and at each run head the
/// run's pair (read at its input position through ``order``) and where the run starts (no
/// atomics: a run's count is the distance to the next start). ``rank``: inclusive count of run
/// heads (pair id + 1).
__global__ void runs_kernel(const int64_t* __restrict__ order, const int64_t* __restrict__ keys,
                            const int64_t* __restrict__ tids, const int64_t* __restrict__ rank,
                            const int64_t* __restrict__ head, int64_t n,
                            int64_t* __restrict__ inverse, int64_t* __restrict__ uk,
                            int64_t* __restrict__ ut, int64_t* __restrict__ run_start) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t g = rank[i] - 1;
  const int64_t at = order[i];
  inverse[at] = g;
  if (head[i]) {
    uk[g] = keys[at];
    ut[g] = tids[at];
    run_start[g] = i;
  }
}

/// Each pair's count, the distance between run starts; ``u`` is read on the device (the kernel
/// is queued before the host knows it).
__global__ void run_counts_kernel(const int64_t* __restrict__ run_start,
                                  const int64_t* __restrict__ u_dev, int64_t n,
                                  int64_t* __restrict__ counts) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t u = *u_dev;
  if (g >= u) return;
  counts[g] = (g + 1 < u ? run_start[g + 1] : n) - run_start[g];
}

/// The unique's outputs in buffers of n rows (u <= n), filled before the readback says u (each
/// its own allocation: an op's outputs start at storage offset 0, as its fake kernel's do).
struct UniqueTail {
  at::Tensor inverse, uk, ut, counts;
};

/// Queue the unique's last two kernels before its readback (the host then only cuts the
/// buffers to u rows): ``order`` sorted position -> input position, equal pairs adjacent;
/// ``rank``/``head`` (n,) int64 over the sorted positions; ``u_dev`` the unique count on the
/// device.
UniqueTail launch_tail(const at::Tensor& order, const at::Tensor& keys, const at::Tensor& tids,
                       const at::Tensor& rank, const at::Tensor& head, const int64_t* u_dev) {
  const int64_t n = order.numel();
  const auto opts = keys.options();
  UniqueTail tail{at::empty({n}, opts), at::empty({n}, opts), at::empty({n}, opts),
                  at::empty({n}, opts)};
  auto run_start = at::empty({n}, opts);
  auto stream = at::cuda::getCurrentCUDAStream();
  runs_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      order.data_ptr<int64_t>(), keys.data_ptr<int64_t>(), tids.data_ptr<int64_t>(),
      rank.data_ptr<int64_t>(), head.data_ptr<int64_t>(), n, tail.inverse.data_ptr<int64_t>(),
      tail.uk.data_ptr<int64_t>(), tail.ut.data_ptr<int64_t>(), run_start.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  run_counts_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      run_start.data_ptr<int64_t>(), u_dev, n, tail.counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return tail;
}

UniqueResult finish_unique(const UniqueTail& tail, int64_t u, const at::Tensor& host_counts,
                           const at::Tensor& order, bool with_order) {
  return {tail.uk.narrow(0, 0, u), tail.ut.narrow(0, 0, u), tail.inverse,
          tail.counts.narrow(0, 0, u), host_counts, with_order ? order : order.new_empty({0})};
}

/// The exact form: sort by key, then stably by table id (two radix sorts); used when the one-word
/// form finds two different pairs with the same word. ``host_extra``: numbers (CPU) appended to
/// the per-table counts.
UniqueResult segmented_unique_two_sorts(const at::Tensor& k, const at::Tensor& t,
                                        int64_t num_tables, bool with_order,
                                        const at::Tensor& host_extra) {
  const int64_t n = k.numel();
  const auto opts = k.options();
  const auto by_key = at::sort(k, /*stable=*/true, 0, false);
  at::Tensor order = std::get<1>(by_key);
  at::Tensor sk = std::get<0>(by_key);
  at::Tensor st;
  if (num_tables > 1) {
    const auto by_table = at::sort(t.index_select(0, order), /*stable=*/true, 0, false);
    st = std::get<0>(by_table);
    order = order.index_select(0, std::get<1>(by_table));
    sk = k.index_select(0, order);
  } else {
    st = t.index_select(0, order);
  }
  auto head = at::ones({n}, opts.dtype(at::kBool));
  if (n > 1) {
    head.narrow(0, 1, n - 1)
        .copy_((sk.narrow(0, 1, n - 1) != sk.narrow(0, 0, n - 1)) |
               (st.narrow(0, 1, n - 1) != st.narrow(0, 0, n - 1)));
  }
  const auto rank = at::cumsum(head, 0, at::kLong);
  const auto heads = head.to(at::kLong);
  auto per_table = at::zeros({num_tables}, opts);
  per_table.index_add_(0, st, heads);
  const auto small = at::cat({per_table, rank.narrow(0, n - 1, 1)});  // [per-table counts, u]
  const UniqueTail tail =
      launch_tail(order, k, t, rank, heads, small.data_ptr<int64_t>() + num_tables);
  auto host = small.cpu();
  const int64_t u = host.data_ptr<int64_t>()[num_tables];
  auto counts = host_extra.defined() ? at::cat({host.narrow(0, 0, num_tables), host_extra})
                                     : host.narrow(0, 0, num_tables);
  return finish_unique(tail, u, counts, order, with_order);
}

__global__ void pair_word_kernel(const int64_t* __restrict__ keys,
                                 const int64_t* __restrict__ tids, int64_t n,
                                 int64_t* __restrict__ words) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  words[i] = pair_word(keys[i], tids[i]);
}

/// Over the sorted words: run heads (1 where a word differs from the previous one), their number
/// (``num_heads``: the unique count, one add per block), the number of pairs per table
/// (shared-memory counts per block when the tables are few), and a flag set when one word holds
/// two different pairs (equal words of one table are one pair: the word is a bijection of the
/// key per table, so a run holds two pairs only where its table id changes). Table ids are read
/// at the input positions (``order``).
__global__ void run_heads_kernel(const int64_t* __restrict__ words,
                                 const int64_t* __restrict__ order,
                                 const int64_t* __restrict__ tids, int64_t n, int64_t num_tables,
                                 int64_t* __restrict__ head, unsigned long long* __restrict__ num_heads,
                                 unsigned long long* __restrict__ per_table,
                                 int64_t* __restrict__ clash) {
  __shared__ unsigned int counts[kSharedTables];
  const bool shared = num_tables <= kSharedTables;
  if (shared) {
    for (int64_t j = threadIdx.x; j < num_tables; j += blockDim.x) counts[j] = 0;
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  bool h = false;
  if (i < n) {
    h = i == 0 || words[i] != words[i - 1];
    head[i] = h ? 1 : 0;
    const int64_t t = tids[order[i]];
    if (!h && t != tids[order[i - 1]]) *clash = 1;
    if (h && t >= 0 && t < num_tables) {
      if (shared) {
        atomicAdd(&counts[t], 1u);
      } else {
        atomicAdd(&per_table[t], 1ULL);
      }
    }
  }
  const int block_heads = __syncthreads_count(h);  // also the barrier before the table counts
  if (threadIdx.x == 0 && block_heads) {
    atomicAdd(num_heads, static_cast<unsigned long long>(block_heads));
  }
  if (shared) {
    for (int64_t j = threadIdx.x; j < num_tables; j += blockDim.x) {
      if (counts[j]) atomicAdd(&per_table[j], static_cast<unsigned long long>(counts[j]));
    }
  }
}

/// The unique over sort words (k, t: the (n,) keys and table ids, n > 0). ``small``: the zeroed
/// readback, [per-table counts (T), ``num_extra`` numbers already written on the device, u,
/// clash]. Every kernel is queued before the one readback.
UniqueResult unique_by_words(const at::Tensor& k, const at::Tensor& t, const at::Tensor& words,
                             const at::Tensor& small, int64_t num_tables, bool with_order,
                             int64_t num_extra) {
  const int64_t n = k.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  // One stable sort: equal pairs end up adjacent, each run in input order.
  const auto by_word = at::sort(words, /*stable=*/true, 0, false);
  const auto& sw = std::get<0>(by_word);
  const auto order = std::get<1>(by_word);
  auto head = at::empty({n}, k.options());
  int64_t* sp = small.data_ptr<int64_t>();
  int64_t* u_at = sp + num_tables + num_extra;  // then clash at u_at + 1
  run_heads_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      sw.data_ptr<int64_t>(), order.data_ptr<int64_t>(), t.data_ptr<int64_t>(), n, num_tables,
      head.data_ptr<int64_t>(), reinterpret_cast<unsigned long long*>(u_at),
      reinterpret_cast<unsigned long long*>(sp), u_at + 1);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto rank = at::cumsum(head, 0);  // pair id + 1 at each sorted position
  const UniqueTail tail = launch_tail(order, k, t, rank, head, u_at);
  const auto host = small.cpu();  // the one readback
  const int64_t* hp = host.data_ptr<int64_t>() + num_tables + num_extra;  // u, clash
  if (hp[1] != 0) {
    const at::Tensor extra = num_extra ? host.narrow(0, num_tables, num_extra) : at::Tensor();
    return segmented_unique_two_sorts(k, t, num_tables, with_order, extra);
  }
  return finish_unique(tail, hp[0], host.narrow(0, 0, num_tables + num_extra), order, with_order);
}

UniqueResult segmented_unique_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, bool with_order) {
  const char* op = "segmented_unique";
  check_segmented_unique(keys, table_ids, num_tables, op);
  const at::cuda::CUDAGuard guard(keys.device());
  const auto k = keys.contiguous();
  const auto t = table_ids.contiguous();
  const int64_t n = k.numel();
  const auto opts = k.options();
  if (n == 0) {
    return {k.new_empty({0}), k.new_empty({0}), k.new_empty({0}), k.new_empty({0}),
            at::zeros({num_tables}, opts.device(at::kCPU)), k.new_empty({0})};
  }
  at::Tensor words = k;  // one table: the words are the keys
  if (num_tables > 1) {
    words = at::empty({n}, opts);
    pair_word_kernel<<<unique_blocks(n), kUniqueThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        k.data_ptr<int64_t>(), t.data_ptr<int64_t>(), n, words.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return unique_by_words(k, t, words, at::zeros({num_tables + 2}, opts), num_tables, with_order,
                         0);
}

// ---- bag_unique: table ids from the batch's offsets, then the segmented unique ----

/// One thread per index: its table (a binary search over the features' first offsets) and its
/// sort word; and the offsets check's numbers (``check`` zeroed before the launch): first,
/// last, decreasing bags.
__global__ void bag_words_kernel(const int64_t* __restrict__ keys,
                                 const int64_t* __restrict__ offsets,
                                 const int64_t* __restrict__ ft, int64_t F, int64_t B, int64_t n,
                                 int64_t num_bags, int64_t* __restrict__ tids,
                                 int64_t* __restrict__ words,
                                 unsigned long long* __restrict__ check) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) {
    check[0] = static_cast<unsigned long long>(offsets[0]);
    check[1] = static_cast<unsigned long long>(offsets[num_bags]);
  }
  if (i < num_bags && offsets[i + 1] < offsets[i]) atomicAdd(&check[2], 1ULL);
  if (i >= n) return;
  // The last feature whose first index is <= i (features with no index share their start with
  // the next one, so the search passes over them). Offsets are not trusted: the id stays one of
  // feature_tables whatever they hold.
  int64_t lo = 0, hi = F - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid * B] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t t = ft[lo];
  tids[i] = t;
  words[i] = pair_word(keys[i], t);
}

UniqueResult bag_unique_cuda(const at::Tensor& keys, const at::Tensor& offsets,
                             const at::Tensor& feature_tables, int64_t batch_size,
                             int64_t num_tables, bool with_order) {
  const char* op = "bag_unique";
  check_bag_unique(keys, offsets, feature_tables, batch_size, num_tables, op);
  const at::cuda::CUDAGuard guard(keys.device());
  const auto k = keys.contiguous();
  const auto off = offsets.contiguous();
  const auto ft = feature_tables.contiguous();
  const int64_t n = k.numel();
  const auto opts = k.options();
  const int64_t num_bags = off.numel() - 1;
  auto small = at::zeros({num_tables + kCheckNumbers + 2}, opts);
  auto ids = at::empty({2, n}, opts);  // table ids, sort words
  const auto t = ids.select(0, 0);
  const auto words = ids.select(0, 1);
  const int64_t threads_needed = std::max<int64_t>({n, num_bags, 1});
  bag_words_kernel<<<unique_blocks(threads_needed), kUniqueThreads, 0,
                     at::cuda::getCurrentCUDAStream()>>>(
      k.data_ptr<int64_t>(), off.data_ptr<int64_t>(), ft.data_ptr<int64_t>(), ft.numel(),
      batch_size, n, num_bags, t.data_ptr<int64_t>(), words.data_ptr<int64_t>(),
      reinterpret_cast<unsigned long long*>(small.data_ptr<int64_t>() + num_tables));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (n == 0) {
    const auto host = small.cpu();
    return {k.new_empty({0}), k.new_empty({0}), k.new_empty({0}), k.new_empty({0}),
            host.narrow(0, 0, num_tables + kCheckNumbers), k.new_empty({0})};
  }
  return unique_by_words(k, t, words, small, num_tables, with_order, kCheckNumbers);
}

// ---- per-table placement counts: shared-memory counts per block, one global add per table ----

__global__ void placement_counts_kernel(const int64_t* __restrict__ tids,
                                        const int64_t* __restrict__ slots,
                                        const bool* __restrict__ is_new,
                                        const int64_t* __restrict__ sizes, int64_t n, int64_t T,
                                        unsigned long long* __restrict__ out) {
  __shared__ unsigned int counts[2 * kSharedTables];
  const bool shared = T <= kSharedTables;
  if (blockIdx.x == 0) {  // the sizes column: plain stores, no other thread writes it
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
      out[j * 3 + 2] = static_cast<unsigned long long>(sizes[j]);
    }
  }
  if (shared) {
    for (int64_t j = threadIdx.x; j < 2 * T; j += blockDim.x) counts[j] = 0;
  }
  __syncthreads();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = tids[i];
    if (t < 0 || t >= T) continue;
    const int64_t col = slots[i] < 0 ? 1 : (is_new[i] ? 0 : -1);
    if (col < 0) continue;
    if (shared) {
      atomicAdd(&counts[t * 2 + col], 1u);
    } else {
      atomicAdd(&out[t * 3 + col], 1ULL);
    }
  }
  __syncthreads();
  if (shared) {
    for (int64_t j = threadIdx.x; j < 2 * T; j += blockDim.x) {
      if (counts[j]) {
        atomicAdd(&out[(j / 2) * 3 + j % 2], static_cast<unsigned long long>(counts[j]));
      }
    }
  }
}

at::Tensor placement_counts_cuda(const at::Tensor& table_ids, const at::Tensor& slots,
                                 const at::Tensor& is_new, const at::Tensor& sizes) {
  const char* op = "placement_counts";
  check_placement_counts(table_ids, slots, is_new, sizes, op);
  const at::cuda::CUDAGuard guard(table_ids.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto nw = is_new.contiguous();
  const auto sz = sizes.contiguous();
  const int64_t num_tables = sz.numel();
  auto out = at::zeros({num_tables, 3}, tid.options());
  const int64_t n = sl.numel();
  const int threads = 256;
  // A grid-stride loop over a bounded grid: few blocks, so few global adds per table (one block
  // at least: it writes the sizes column).
  const int64_t blocks = std::max<int64_t>(std::min<int64_t>((n + threads - 1) / threads, 1024), 1);
  placement_counts_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), nw.data_ptr<bool>(),
      sz.data_ptr<int64_t>(), n, num_tables,
      reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("segmented_unique", &segmented_unique_cuda);
  m.impl("bag_unique", &bag_unique_cuda);
  m.impl("placement_counts", &placement_counts_cuda);
  m.impl("grouped_gather", &grouped_gather_cuda);
  m.impl("grouped_scatter", &grouped_scatter_cuda);
  m.impl("grouped_init_rows", &grouped_init_rows_cuda);
  m.impl("grouped_pooled_gather", &grouped_pooled_gather_cuda);
  m.impl("grouped_reduce_grads", &grouped_reduce_grads_cuda);
  m.impl("grouped_update", &grouped_update_cuda);
  m.impl("grouped_reduce_update", &grouped_reduce_update_cuda);
}

}  // namespace dynamicemb
