// CUDA kernels of the lookup ops; same schemas (csrc/ops.cpp, "lookup" section) and the same
// semantics as csrc/cpu/lookup.cpp, which documents the row layout and formulas.
//
// Layout: per op a kernel and a launcher; every launch runs on the current stream and is checked.
// Rows are handled by one warp each (lanes stride over the embedding dim), so per-row reductions
// (row-wise Adagrad's mean of g^2) are warp shuffles.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "dynamicemb/bag_checks.h"
#include "dynamicemb/check.h"

namespace dynamicemb {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // warps per block

inline int64_t blocks_for(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- pooled_gather: one warp per bag ----
template <typename scalar_t>
__global__ void pooled_gather_kernel(const scalar_t* __restrict__ emb, const int64_t* __restrict__ inverse,
                                     const int64_t* __restrict__ offsets, const float* __restrict__ weights,
                                     int64_t num_bags, int64_t D, int64_t row_stride, int64_t mode,
                                     scalar_t* __restrict__ out) {
  const int64_t b = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (b >= num_bags) return;
  const int64_t lo = offsets[b], hi = offsets[b + 1];
  const float scale = (mode == kPoolMean && hi > lo) ? 1.0f / float(hi - lo) : 1.0f;
  for (int64_t d = threadIdx.x; d < D; d += kWarp) {
    float acc = 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      const float w = weights ? weights[i] : 1.0f;
      acc += w * float(emb[inverse[i] * row_stride + d]);
    }
    out[b * D + d] = scalar_t(acc * scale);
  }
}

// ---- data checks of a bag batch, on the device, one sync: offsets start at 0, end at n and never
// decrease; inverse lies in [0, u). Run before any output is written (the CPU kernels check the
// same while reading).
// report: [flags, first bad inverse position, first decreasing b, off[0], off[b]] (the two "first"
// words encoded, see record_first).
constexpr int64_t kBadEnds = 1, kBadOrder = 2, kBadInverse = 4;
// A "first bad index" word holds the maximum of kMinKey - i, so a zeroed report (one memset) starts
// every word empty; first_index() decodes it.
constexpr unsigned long long kMinKey = 0x7fffffffffffffffULL;

__device__ inline void record_first(unsigned long long* word, int64_t i) {
  atomicMax(word, kMinKey - static_cast<unsigned long long>(i));
}

inline int64_t first_index(int64_t word) {
  return static_cast<int64_t>(kMinKey - static_cast<unsigned long long>(word));
}

__global__ void validate_bags_kernel(const int64_t* __restrict__ inverse, int64_t n,
                                     const int64_t* __restrict__ offsets, int64_t num_bags, int64_t u,
                                     unsigned long long* __restrict__ report) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n || i < num_bags;
       i += stride) {
    if (i < n && (inverse[i] < 0 || inverse[i] >= u)) {
      atomicOr(&report[0], (unsigned long long)kBadInverse);
      record_first(&report[1], i);
    }
    if (i < num_bags && offsets[i] > offsets[i + 1]) {
      atomicOr(&report[0], (unsigned long long)kBadOrder);
      record_first(&report[2], i);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    report[3] = (unsigned long long)offsets[0];
    report[4] = (unsigned long long)offsets[num_bags];
    if (offsets[0] != 0 || offsets[num_bags] != n) atomicOr(&report[0], (unsigned long long)kBadEnds);
  }
}

void validate_bags_cuda(const at::Tensor& inv, const at::Tensor& off, int64_t u, const char* op) {
  const int64_t n = inv.numel(), num_bags = off.numel() - 1;
  auto report = at::zeros({5}, off.options());
  const int threads = 256;
  const int64_t work = std::max<int64_t>(std::max<int64_t>(n, num_bags), 1);
  const int blocks = int(std::min<int64_t>((work + threads - 1) / threads, 1024));
  validate_bags_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      inv.data_ptr<int64_t>(), n, off.data_ptr<int64_t>(), num_bags, u,
      reinterpret_cast<unsigned long long*>(report.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto r = report.cpu();
  const int64_t* p = r.data_ptr<int64_t>();
  DEMB_CHECK_VALUE(!(p[0] & kBadEnds), op, ": offsets must start at 0 and end at n=", n, ", got [",
                    p[3], ", ...,", p[4], "]");
  if (p[0] & kBadOrder) {
    const int64_t b = first_index(p[2]);
    const auto pair = off.narrow(0, b, 2).cpu();
    DEMB_CHECK_VALUE(false, op, ": offsets must be non-decreasing; offsets[", b, "]=",
                      pair.data_ptr<int64_t>()[0], " > offsets[", b + 1, "]=",
                      pair.data_ptr<int64_t>()[1]);
  }
  if (p[0] & kBadInverse) {
    const int64_t i = first_index(p[1]);
    DEMB_CHECK_INDEX(false, op, ": inverse[", i, "]=", inv.select(0, i).item<int64_t>(),
                      " out of range [0, ", u, ")");
  }
}

at::Tensor pooled_gather_cuda(const at::Tensor& embeddings, const at::Tensor& inverse,
                              const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                              int64_t mode, bool check) {
  check_bags(inverse, offsets, weights, mode, "pooled_gather");
  DEMB_CHECK_VALUE(embeddings.dim() == 2, "pooled_gather: embeddings must be (u, D), got ",
                    embeddings.sizes());
  check_on_device(inverse, embeddings.device(), "inverse", "pooled_gather");
  const at::cuda::CUDAGuard guard(embeddings.device());
  // Rows may be a column slice of a table's value rows: rows are addressed by their own stride.
  const auto emb = embeddings.stride(1) == 1 ? embeddings : embeddings.contiguous();
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  if (check) validate_bags_cuda(inv, off, emb.size(0), "pooled_gather");
  const int64_t num_bags = off.numel() - 1, D = emb.size(1);
  auto out = at::zeros({num_bags, D}, emb.options());
  if (num_bags == 0 || D == 0) return out;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, emb.scalar_type(), "pooled_gather", [&] {
    pooled_gather_kernel<scalar_t><<<blocks_for(num_bags), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
        emb.data_ptr<scalar_t>(), inv.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
        w.defined() ? w.data_ptr<float>() : nullptr, num_bags, D, emb.stride(0), mode,
        out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// ---- reduce_grads: deterministic two-pass segmented sum over the key-sorted positions ----
// Under a power law one key can own thousands of positions, so one warp per key is a serial chain
// as long as the hottest key (it was 3.5 ms per table at 1M ids a batch). Each key's positions (in
// input order, from a stable sort) are cut into chunks of kChunk; pass 1 sums each chunk with one
// warp, pass 2 sums a key's chunk partials in chunk order. The order of additions is fixed by the
// input, so results are deterministic (not bit-equal to the CPU kernel's single running sum).
constexpr int64_t kChunk = 64;

__global__ void bag_of_kernel(const int64_t* __restrict__ offsets, int64_t num_bags,
                              int64_t* __restrict__ bag_of) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= num_bags) return;
  for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of[i] = b;
}

// The key owning chunk c: the last k with chunk_start[k] <= c (chunk_start is non-decreasing).
__device__ inline int64_t key_of_chunk(const int64_t* chunk_start, int64_t num_unique, int64_t c) {
  int64_t lo = 0, hi = num_unique;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (chunk_start[mid] <= c) lo = mid; else hi = mid;
  }
  return lo;
}

__global__ void chunk_sums_kernel(const float* __restrict__ grad_bags, const int64_t* __restrict__ perm,
                                  const int64_t* __restrict__ starts,
                                  const int64_t* __restrict__ chunk_start, const int64_t* __restrict__ bag_of,
                                  const int64_t* __restrict__ offsets, const float* __restrict__ weights,
                                  int64_t num_unique, int64_t max_chunks, int64_t D, int64_t mode,
                                  float* __restrict__ partial) {
  const int64_t c = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (c >= max_chunks || c >= chunk_start[num_unique]) return;
  const int64_t k = key_of_chunk(chunk_start, num_unique, c);
  const int64_t lo = starts[k] + (c - chunk_start[k]) * kChunk;
  const int64_t hi = min(starts[k + 1], lo + kChunk);
  for (int64_t d = threadIdx.x; d < D; d += kWarp) {
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t i = perm[j];
      const int64_t b = bag_of[i];
      float scale = weights ? weights[i] : 1.0f;
      if (mode == kPoolMean) scale /= float(offsets[b + 1] - offsets[b]);
      acc += scale * grad_bags[b * D + d];
    }
    partial[c * D + d] = acc;
  }
}

__global__ void key_sums_kernel(const float* __restrict__ partial, const int64_t* __restrict__ chunk_start,
                                int64_t num_unique, int64_t D, float* __restrict__ out) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (k >= num_unique) return;
  for (int64_t d = threadIdx.x; d < D; d += kWarp) {
    float acc = 0.0f;
    for (int64_t c = chunk_start[k]; c < chunk_start[k + 1]; ++c) acc += partial[c * D + d];
    out[k * D + d] = acc;
  }
}

at::Tensor reduce_per_key_cuda(const at::Tensor& grad_bags, const at::Tensor& inverse,
                               const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                               int64_t mode, int64_t num_unique, const char* op,
                               bool check) {
  check_bags(inverse, offsets, weights, mode, op);
  DEMB_CHECK_VALUE(grad_bags.dim() == 2 && grad_bags.size(0) == offsets.numel() - 1, op,
                    ": grad_bags must be (b, D) with b = offsets.numel()-1 = ", offsets.numel() - 1,
                    ", got ", grad_bags.sizes());
  DEMB_CHECK_VALUE(num_unique >= 0, op, ": num_unique must be >= 0, got ", num_unique);
  check_on_device(inverse, grad_bags.device(), "inverse", op);
  const at::cuda::CUDAGuard guard(grad_bags.device());
  const auto g = grad_bags.contiguous().to(at::kFloat);
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  if (check) validate_bags_cuda(inv, off, num_unique, op);
  const int64_t n = inv.numel(), num_bags = off.numel() - 1, D = g.size(1);
  auto out = at::empty({num_unique, D}, g.options());  // every row is written
  if (n == 0 || num_unique == 0 || D == 0) return out.zero_();
  auto stream = at::cuda::getCurrentCUDAStream();
  // Stable sort keeps each key's positions in input order, so the sum order is fixed; the start
  // of each key's run comes from a search in the sorted keys (bincount would sync for its max).
  const auto sorted = at::sort(inv, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto& sorted_keys = std::get<0>(sorted);
  const auto perm = std::get<1>(sorted).contiguous();
  const auto starts = at::searchsorted(sorted_keys, at::arange(num_unique + 1, inv.options()));
  const auto counts = starts.narrow(0, 1, num_unique) - starts.narrow(0, 0, num_unique);
  auto chunk_start = at::zeros({num_unique + 1}, inv.options());
  chunk_start.narrow(0, 1, num_unique).copy_(at::cumsum(at::floor_divide(counts + (kChunk - 1), kChunk), 0));
  // Upper bound on the chunk count without reading it back: sum ceil(c/C) <= n/C + u.
  const int64_t max_chunks = n / kChunk + num_unique;
  auto partial = at::empty({max_chunks, D}, g.options());
  auto bag_of = at::empty({n}, inv.options());
  const int threads = 256;
  bag_of_kernel<<<(num_bags + threads - 1) / threads, threads, 0, stream>>>(
      off.data_ptr<int64_t>(), num_bags, bag_of.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  chunk_sums_kernel<<<blocks_for(max_chunks), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
      g.data_ptr<float>(), perm.data_ptr<int64_t>(), starts.data_ptr<int64_t>(),
      chunk_start.data_ptr<int64_t>(), bag_of.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
      w.defined() ? w.data_ptr<float>() : nullptr, num_unique, max_chunks, D, mode,
      partial.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  key_sums_kernel<<<blocks_for(num_unique), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
      partial.data_ptr<float>(), chunk_start.data_ptr<int64_t>(), num_unique, D, out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor reduce_grads_cuda(const at::Tensor& grad_bags, const at::Tensor& inverse,
                             const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                             int64_t mode, int64_t num_unique, bool check) {
  return reduce_per_key_cuda(grad_bags, inverse, offsets, weights, mode, num_unique, "reduce_grads", check);
}

// ---- fused optimizer updates: one warp per slot ----
struct UpdateParams {
  float lr, eps, beta1, beta2, weight_decay, bc1, bc2;
  int64_t weight_decay_mode;
};

enum class Opt { kSgd, kAdagrad, kRowwiseAdagrad, kAdam };

template <Opt kOpt>
__global__ void update_kernel(float* __restrict__ values, const int64_t* __restrict__ slots,
                              const float* __restrict__ grads, int64_t n, int64_t W, int64_t D,
                              int64_t capacity, UpdateParams p) {
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= n) return;
  const int64_t s = slots[i];
  if (s < 0 || s >= capacity) return;  // -1: no home; >= capacity only when the caller skipped checks
  float* w = values + s * W;
  const float* g = grads + i * D;
  if constexpr (kOpt == Opt::kSgd) {
    for (int64_t d = threadIdx.x; d < D; d += kWarp) w[d] -= p.lr * g[d];
  } else if constexpr (kOpt == Opt::kAdagrad) {
    float* m = w + D;
    for (int64_t d = threadIdx.x; d < D; d += kWarp) {
      m[d] += g[d] * g[d];
      w[d] -= p.lr * g[d] / (sqrtf(m[d]) + p.eps);
    }
  } else if constexpr (kOpt == Opt::kRowwiseAdagrad) {
    float local = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += kWarp) {
      const float gd = p.weight_decay_mode == 1 ? g[d] + p.weight_decay * w[d] : g[d];
      local += gd * gd;
    }
    const float sum_sq = warp_sum(local);
    float* m = w + D;
    const float new_m = m[0] + (D > 0 ? sum_sq / float(D) : 0.0f);
    const float mult = p.lr / (sqrtf(new_m) + p.eps);
    float correction = 1.0f;
    if (p.weight_decay_mode == 1) correction = 1.0f - mult * p.weight_decay;
    if (p.weight_decay_mode == 2) correction = 1.0f - p.lr * p.weight_decay;
    for (int64_t d = threadIdx.x; d < D; d += kWarp) w[d] = correction * w[d] - mult * g[d];
    __syncwarp();
    if (threadIdx.x == 0) m[0] = new_m;
  } else {
    float* m = w + D;
    float* v = w + 2 * D;
    for (int64_t d = threadIdx.x; d < D; d += kWarp) {
      m[d] = p.beta1 * m[d] + (1.0f - p.beta1) * g[d];
      v[d] = p.beta2 * v[d] + (1.0f - p.beta2) * g[d] * g[d];
      w[d] -= p.lr * (m[d] / p.bc1 / (sqrtf(v[d] / p.bc2) + p.eps) + p.weight_decay * w[d]);
    }
  }
}

// ``slot_range``: also check slots < capacity (one device-to-host read; false when the caller passed
// check=False).
int64_t check_update_cuda(const at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                          int64_t state_per_dim, int64_t state_fixed, const char* op,
                          bool slot_range) {
  DEMB_CHECK_TYPE(values.scalar_type() == at::kFloat && grads.scalar_type() == at::kFloat, op,
                   ": values and grads must be float32, got ", values.scalar_type(), " and ",
                   grads.scalar_type());
  DEMB_CHECK_TYPE(slots.scalar_type() == at::kLong, op, ": slots must be int64, got ",
                   slots.scalar_type());
  DEMB_CHECK_VALUE(values.dim() == 2 && values.is_contiguous(), op,
                    ": values must be a contiguous (capacity, row_width) tensor");
  DEMB_CHECK_VALUE(grads.dim() == 2 && slots.dim() == 1 && grads.size(0) == slots.size(0), op,
                    ": grads must be (n, D) and slots (n,)");
  check_on_device(slots, values.device(), "slots", op);
  check_on_device(grads, values.device(), "grads", op);
  const int64_t D = grads.size(1);
  const int64_t need = D + state_per_dim * D + state_fixed;
  DEMB_CHECK_VALUE(values.size(1) >= need, op, ": row_width ", values.size(1),
                    " is too small for dim ", D, " and its optimizer state (needs ", need, ")");
  if (slot_range && slots.numel() > 0) {
    const int64_t hi = slots.max().item<int64_t>();
    DEMB_CHECK_INDEX(hi < values.size(0), op, ": slot ", hi, " out of range [0, ", values.size(0), ")");
  }
  return D;
}

template <Opt kOpt>
void launch_update(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                   const UpdateParams& p) {
  const at::cuda::CUDAGuard guard(values.device());
  const auto s = slots.contiguous();
  const auto g = grads.contiguous();
  const int64_t n = s.numel();
  if (n == 0) return;
  update_kernel<kOpt><<<blocks_for(n), dim3(kWarp, kRowsPerBlock), 0, at::cuda::getCurrentCUDAStream()>>>(
      values.data_ptr<float>(), s.data_ptr<int64_t>(), g.data_ptr<float>(), n, values.size(1),
      g.size(1), values.size(0), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void sgd_update_cuda(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads, double lr, bool check) {
  check_update_cuda(values, slots, grads, 0, 0, "sgd_update", check);
  UpdateParams p{};
  p.lr = float(lr);
  launch_update<Opt::kSgd>(values, slots, grads, p);
}

void adagrad_update_cuda(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                         double lr, double eps, bool check) {
  check_update_cuda(values, slots, grads, 1, 0, "adagrad_update", check);
  UpdateParams p{};
  p.lr = float(lr);
  p.eps = float(eps);
  launch_update<Opt::kAdagrad>(values, slots, grads, p);
}

void rowwise_adagrad_update_cuda(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads,
                                 double lr, double eps, double weight_decay, int64_t weight_decay_mode, bool check) {
  check_update_cuda(values, slots, grads, 0, 1, "rowwise_adagrad_update", check);
  DEMB_CHECK_VALUE(weight_decay_mode >= 0 && weight_decay_mode <= 2,
                    "rowwise_adagrad_update: weight_decay_mode must be 0 (NONE), 1 (L2) or 2 "
                    "(DECOUPLE), got ", weight_decay_mode);
  UpdateParams p{};
  p.lr = float(lr);
  p.eps = float(eps);
  p.weight_decay = float(weight_decay);
  p.weight_decay_mode = weight_decay_mode;
  launch_update<Opt::kRowwiseAdagrad>(values, slots, grads, p);
}

void adam_update_cuda(at::Tensor& values, const at::Tensor& slots, const at::Tensor& grads, double lr,
                      double eps, double beta1, double beta2, double weight_decay, int64_t step, bool check) {
  check_update_cuda(values, slots, grads, 2, 0, "adam_update", check);
  DEMB_CHECK_VALUE(step >= 1, "adam_update: step must be >= 1 (bias correction), got ", step);
  UpdateParams p{};
  p.lr = float(lr);
  p.eps = float(eps);
  p.beta1 = float(beta1);
  p.beta2 = float(beta2);
  p.weight_decay = float(weight_decay);
  p.bc1 = 1.0f - powf(float(beta1), float(step));
  p.bc2 = 1.0f - powf(float(beta2), float(step));
  launch_update<Opt::kAdam>(values, slots, grads, p);
}

// Sort-based on the GPU (torch's radix-sort unique): unique keys come out ascending, which is
// deterministic too; the CPU kernel returns first-occurrence order (both are valid orders: the op
// promises unique keys, the inverse and the counts, not an order).
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_cuda(const at::Tensor& keys) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong, "unique: keys must be int64, got ",
                   keys.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1, "unique: keys must be 1-D, got ", keys.sizes());
  const at::cuda::CUDAGuard guard(keys.device());
  return at::_unique2(keys, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/true);
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("unique", &unique_cuda);
  m.impl("pooled_gather", &pooled_gather_cuda);
  m.impl("reduce_grads", &reduce_grads_cuda);
  m.impl("sgd_update", &sgd_update_cuda);
  m.impl("adagrad_update", &adagrad_update_cuda);
  m.impl("rowwise_adagrad_update", &rowwise_adagrad_update_cuda);
  m.impl("adam_update", &adam_update_cuda);
}

}  // namespace dynamicemb
