// CPU kernels of the per-table lookup ops: pooled gather (the serving path's, inference/tables.py)
// and unique (the sharded input dist's dedup). Schemas: the "lookup" section of csrc/ops.cpp. CUDA
// twins: csrc/cuda/lookup.cu. The training step's ops are the grouped ones (csrc/cpu/grouped.cpp).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

#include "dynamicemb/bag_checks.h"
#include "dynamicemb/hashing.h"
#include "dynamicemb/check.h"

namespace dynamicemb {
namespace {

// Rows sit at random slots of large buffers, so the row loops wait on memory: they prefetch the
// row kPrefetchAhead positions ahead (every cache line of it) while computing the current one.
constexpr int64_t kPrefetchAhead = 8;
constexpr int64_t kCacheLine = 64;

template <int kWrite>
inline void prefetch_bytes(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += kCacheLine) __builtin_prefetch(p + b, kWrite, 3);
}

at::Tensor pooled_gather_cpu(const at::Tensor& embeddings, const at::Tensor& inverse,
                             const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                             int64_t mode, bool /*check: the CPU kernels always check*/) {
  check_bags(inverse, offsets, weights, mode, "pooled_gather");
  DEMB_CHECK_VALUE(embeddings.dim() == 2, "pooled_gather: embeddings must be (u, D), got ",
                    embeddings.sizes());
  // Rows may be a column slice of a wider buffer (the embedding part of a table's value rows):
  // only the innermost stride must be 1, rows are addressed by their own stride.
  const auto emb = embeddings.stride(1) == 1 ? embeddings : embeddings.contiguous();
  const auto inv = inverse.contiguous();
  const auto off = offsets.contiguous();
  const int64_t num_bags = off.numel() - 1;
  const int64_t D = emb.size(1);
  const int64_t u = emb.size(0);
  const int64_t row_stride = emb.stride(0);
  const int64_t* off_p = off.data_ptr<int64_t>();
  const int64_t* inv_p = inv.data_ptr<int64_t>();
  DEMB_CHECK_VALUE(off_p[0] == 0 && off_p[num_bags] == inv.numel(),
                    "pooled_gather: offsets must start at 0 and end at n=", inv.numel(),
                    ", got first ", off_p[0], " last ", off_p[num_bags]);
  const at::Tensor w_c = weights.has_value() ? weights->contiguous() : at::Tensor();
  const float* w_p = w_c.defined() ? w_c.data_ptr<float>() : nullptr;
  // Every element of out is written below: no zero fill (fresh large buffers cost page faults).
  auto out = at::empty({num_bags, D}, emb.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, emb.scalar_type(), "pooled_gather", [&] {
    // float for float/half/bfloat16 (as FBGEMM accumulates), double for double.
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* e = emb.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, num_bags, 64, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> acc(D);
      const int64_t chunk_end = off_p[end];
      for (int64_t b = begin; b < end; ++b) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        const int64_t lo = off_p[b], hi = off_p[b + 1];
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t ahead = i + kPrefetchAhead;
          if (ahead < chunk_end && inv_p[ahead] >= 0 && inv_p[ahead] < u) {
            prefetch_bytes<0>(e + inv_p[ahead] * row_stride, D * int64_t(sizeof(scalar_t)));
          }
          const int64_t r = inv_p[i];
          DEMB_CHECK_INDEX(r >= 0 && r < u, "pooled_gather: inverse[", i, "]=", r,
                            " out of range [0, ", u, ")");
          const acc_t w = w_p ? acc_t(w_p[i]) : acc_t(1);
          const scalar_t* row = e + r * row_stride;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * acc_t(row[d]);
        }
        const acc_t scale = (mode == kPoolMean && hi > lo) ? acc_t(1) / acc_t(hi - lo) : acc_t(1);
        for (int64_t d = 0; d < D; ++d) o[b * D + d] = scalar_t(acc[d] * scale);
      }
    });
  });
  return out;
}

// Deduplicates keys with an open-addressing hash set (linear probing over the table's own hash),
// in one serial pass: O(n), and unique keys come out in order of first occurrence, which makes
// the result (and the table's slot assignment that follows) deterministic.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_cpu(const at::Tensor& keys) {
  DEMB_CHECK_TYPE(keys.scalar_type() == at::kLong, "unique: keys must be int64, got ",
                   keys.scalar_type());
  DEMB_CHECK_VALUE(keys.dim() == 1, "unique: keys must be 1-D, got ", keys.sizes());
  const auto k = keys.contiguous();
  const int64_t n = k.numel();
  const int64_t* kp = k.data_ptr<int64_t>();
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  std::vector<int64_t> slot_of(cap, -1);  // unique index held by each hash slot, -1 = empty
  auto inverse = at::empty({n}, k.options());
  int64_t* inv = inverse.data_ptr<int64_t>();
  std::vector<int64_t> uniq;
  std::vector<int64_t> counts;
  uniq.reserve(n);
  counts.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = hash_key(kp[i]) & mask;
    while (true) {
      const int64_t u = slot_of[h];
      if (u < 0) {
        slot_of[h] = static_cast<int64_t>(uniq.size());
        inv[i] = slot_of[h];
        uniq.push_back(kp[i]);
        counts.push_back(1);
        break;
      }
      if (uniq[u] == kp[i]) {
        inv[i] = u;
        ++counts[u];
        break;
      }
      h = (h + 1) & mask;
    }
  }
  const int64_t m = static_cast<int64_t>(uniq.size());
  auto out_keys = at::empty({m}, k.options());
  auto out_counts = at::empty({m}, k.options());
  std::copy(uniq.begin(), uniq.end(), out_keys.data_ptr<int64_t>());
  std::copy(counts.begin(), counts.end(), out_counts.data_ptr<int64_t>());
  return {out_keys, inverse, out_counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("unique", &unique_cpu);
  m.impl("pooled_gather", &pooled_gather_cpu);
}

}  // namespace dynamicemb
