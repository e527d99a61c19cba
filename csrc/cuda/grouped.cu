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
//
// One translation unit; the ops live in one header each (as csrc/cuda/table.cu's do):
//   grouped_common.cuh  warp shape, DeviceMeta, the data checks
//   grouped_rows.cuh    grouped_gather, grouped_scatter, grouped_init_rows
//   grouped_pool.cuh    grouped_pooled_gather
//   grouped_reduce.cuh  grouped_reduce_grads (the two-pass reduction)
//   grouped_update.cuh  grouped_update, grouped_reduce_update
//   grouped_unique.cuh  segmented_unique, bag_unique, placement_counts

#include <torch/library.h>

#include "grouped_common.cuh"
#include "grouped_pool.cuh"
#include "grouped_reduce.cuh"
#include "grouped_rows.cuh"
#include "grouped_unique.cuh"
#include "grouped_update.cuh"

namespace dynamicemb {

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
