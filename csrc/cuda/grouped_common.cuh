// The CUDA grouped ops' shared pieces: warp shape, the device view of meta (DeviceMeta) and the
// data checks (check=true: one readback each).
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

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

}  // namespace
}  // namespace dynamicemb
