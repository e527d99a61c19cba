// CUDA kernels of the per-table lookup ops (pooled_gather, unique); same schemas (csrc/ops.cpp,
// "lookup" section) and the same semantics as csrc/cpu/lookup.cpp.
//
// Layout: per op a kernel and a launcher; every launch runs on the current stream and is checked.
// Bags are handled by one warp each (lanes stride over the embedding dim).

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
}

}  // namespace dynamicemb
