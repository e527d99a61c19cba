// CPU kernels of the grouped value ops: every op serves all tables of a group in one call, rows
// addressed by (table id, slot) through the (T, 4) metadata described in dynamicemb/grouped.h.
// Schemas: the "grouped" section of csrc/ops.cpp. CUDA twins: csrc/cuda/grouped.cu. The CPU
// kernels always check their data (it costs them no synchronisation) and raise before writing.
//
// One translation unit; the ops live in one header each (as csrc/cuda/table.cu's do):
//   grouped_common.h  prefetch distances, MetaView (checked meta), logical row reads / writes, bags
//   grouped_rows.h    grouped_gather, grouped_scatter, grouped_init_rows
//   grouped_pool.h    grouped_pooled_gather
//   grouped_update.h  grouped_reduce_grads, grouped_update, grouped_reduce_update
//   grouped_unique.h  segmented_unique, bag_unique, placement_counts

#include <torch/library.h>

#include "grouped_common.h"
#include "grouped_pool.h"
#include "grouped_rows.h"
#include "grouped_unique.h"
#include "grouped_update.h"

namespace dynamicemb {

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("segmented_unique", &segmented_unique_cpu);
  m.impl("bag_unique", &bag_unique_cpu);
  m.impl("placement_counts", &placement_counts_cpu);
  m.impl("grouped_gather", &grouped_gather_cpu);
  m.impl("grouped_scatter", &grouped_scatter_cpu);
  m.impl("grouped_init_rows", &grouped_init_rows_cpu);
  m.impl("grouped_pooled_gather", &grouped_pooled_gather_cpu);
  m.impl("grouped_reduce_grads", &grouped_reduce_grads_cpu);
  m.impl("grouped_update", &grouped_update_cpu);
  m.impl("grouped_reduce_update", &grouped_reduce_update_cpu);
}

}  // namespace dynamicemb
