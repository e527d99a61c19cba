// grouped_reduce_grads on CUDA: the deterministic two-pass reduction over key-sorted positions,
// which grouped_reduce_update (grouped_update.cuh) fuses with the update.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_common.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- reduction: deterministic two passes over the key-sorted positions ----

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
    // The chunk's lanes resolve kLanes positions' gradient rows at once (each lane one position's
    // perm -> bag -> row) and hand them round by shuffles, so the row loads do not wait on each
    // other's index loads. Every lane of the chunk runs every pass and position (the shuffles
    // need them all); the columns past the key's dim only skip the loads.
    unsigned mask = 0xffffffffu;  // the chunk's lanes: the warp, or its half
    if constexpr (kLanes < kWarp) mask = ((1u << kLanes) - 1u) << (threadIdx.x & (kWarp - kLanes));
    const int64_t passes = (width + kLanes * 4 - 1) / (kLanes * 4);
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t d = p * kLanes * 4 + lane * 4;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int64_t j0 = lo; j0 < hi; j0 += kLanes) {
        const int n = int(hi - j0 < kLanes ? hi - j0 : kLanes);
        long long mine = 0;
        float my_scale = 0.0f;
        if (lane < n) {
          mine = reinterpret_cast<long long>(grad_source<kPooled>(
              grad, gs0, gs1, perm[j0 + lane], bag_of, offsets, weights, dofs, B, mode, my_scale));
        }
        for (int jj = 0; jj < n; ++jj) {
          const long long from = __shfl_sync(mask, mine, jj, kLanes);
          const float scale = __shfl_sync(mask, my_scale, jj, kLanes);
          if (d >= D) continue;
          const float* src = reinterpret_cast<const float*>(from) + d * gs1;
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
      if (d >= width) continue;
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

}  // namespace
}  // namespace dynamicemb
