/**
 * @file bag_checks.h
 * @brief Argument checks of the per-table bag op (pooled_gather), shared by
 *        the CPU and CUDA kernels so both raise the same errors for the same bad input.
 *
 * These look at dtypes, shapes and the mode only; the data checks (offsets start at 0, end at n and
 * never decrease; inverse within [0, u)) need the values, and each backend runs them where the data
 * lives, before any output is written.
 */
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "dynamicemb/check.h"

namespace dynamicemb {

constexpr int64_t kPoolSum = 0;
constexpr int64_t kPoolMean = 1;

/// Raises unless ``t`` (named ``name``) is on ``device``: a kernel must never read another device's
/// memory, which the dispatcher would allow when one argument is a CUDA tensor and another is not.
inline void check_on_device(const at::Tensor& t, const at::Device& device, const char* name,
                            const char* op) {
  DEMB_CHECK_VALUE(t.device() == device, op, ": ", name, " must be on ", device, ", got ",
                    t.device());
}

inline void check_bags(const at::Tensor& inverse, const at::Tensor& offsets,
                       const std::optional<at::Tensor>& weights, int64_t mode, const char* op) {
  DEMB_CHECK_TYPE(inverse.scalar_type() == at::kLong, op, ": inverse must be int64, got ",
                   inverse.scalar_type());
  DEMB_CHECK_TYPE(offsets.scalar_type() == at::kLong, op, ": offsets must be int64, got ",
                   offsets.scalar_type());
  DEMB_CHECK_VALUE(inverse.dim() == 1 && offsets.dim() == 1, op,
                    ": inverse and offsets must be 1-D, got ", inverse.sizes(), " and ",
                    offsets.sizes());
  DEMB_CHECK_VALUE(offsets.numel() >= 1, op, ": offsets needs at least one element (b+1)");
  check_on_device(offsets, inverse.device(), "offsets", op);
  DEMB_CHECK_VALUE(mode == kPoolSum || mode == kPoolMean, op,
                    ": mode must be 0 (SUM) or 1 (MEAN), got ", mode);
  if (weights.has_value()) {
    DEMB_CHECK_VALUE(weights->dim() == 1 && weights->numel() == inverse.numel(), op,
                      ": weights must be (n,) = (", inverse.numel(), ",), got ", weights->sizes());
    DEMB_CHECK_TYPE(weights->scalar_type() == at::kFloat, op, ": weights must be float32, got ",
                     weights->scalar_type());
    check_on_device(*weights, inverse.device(), "weights", op);
  }
}

}  // namespace dynamicemb
