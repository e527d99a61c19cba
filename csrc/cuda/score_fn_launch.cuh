/**
 * @file score_fn_launch.cuh
 * @brief Runs a compound table's score_function on the GPU before the engine picks victims.
 *
 * dynamicemb_core/table/score_function_cuda.py compiles the user's Python function with numba-cuda
 * into a kernel `victim_ranks(scores, slot_offsets, t, now, out)` that writes, for every slot of
 * table t, the function's float64 result on the slot's words (in the user's tuple order) at the
 * call's time. On CUDA, `score_fns[t]` holds that kernel's handle (a CUkernel, launchable with
 * cuLaunchKernel in the current context), 0 for none.
 *
 * Computing the ranks before the insert is exact: a victim is always a slot this call has not
 * written (the contract protects every slot it writes), so its words, and its rank, are the ones
 * it had when the call began. The driver entry point is looked up through the runtime, so the
 * extension needs no link against libcuda.
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "table_common.cuh"

namespace dynamicemb {
namespace cuda_table {

/** @brief cuLaunchKernel from the driver the runtime already loaded (looked up once). */
inline PFN_cuLaunchKernel_v4000 driver_launch_kernel() {
  static PFN_cuLaunchKernel_v4000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &p, 12000, cudaEnableDefault,
                                                    &status));
    DEMB_CHECK(status == cudaDriverEntryPointSuccess && p != nullptr,
                "dynamicemb (CUDA): cuLaunchKernel not found in the CUDA driver; the compound "
                "score_function needs a CUDA 12+ driver");
    return reinterpret_cast<PFN_cuLaunchKernel_v4000>(p);
  }();
  return fn;
}

/**
 * @brief Fills fn_ranks[g] for every slot g of each table with a score function.
 * @param score_fns_host (T,) int64 on the CPU: kernel handles, 0 for none.
 * @return (T,) uint8 on the device, 1 where the table's victims are ranked by fn_ranks.
 */
inline at::Tensor compute_fn_ranks(const at::Tensor& score_fns_host, const at::Tensor& scores,
                                   const at::Tensor& slot_offsets, const at::Tensor& now,
                                   at::Tensor& fn_ranks, cudaStream_t stream) {
  const int64_t num_tables = score_fns_host.size(0);
  const int64_t* handles = score_fns_host.data_ptr<int64_t>();
  const int64_t total_slots = fn_ranks.size(0);
  // A grid-stride kernel: enough blocks to fill the GPU, never more than the slots need.
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(
      blocks_for(total_slots, kBlockThreads), int64_t{sms} * 8));
  for (int64_t t = 0; t < num_tables; ++t) {
    if (handles[t] == 0) continue;
    uint64_t scores_ptr = reinterpret_cast<uint64_t>(scores.data_ptr<int64_t>());
    uint64_t offsets_ptr = reinterpret_cast<uint64_t>(slot_offsets.data_ptr<int64_t>());
    int64_t table = t;
    uint64_t now_ptr = reinterpret_cast<uint64_t>(now.data_ptr<int64_t>());
    uint64_t out_ptr = reinterpret_cast<uint64_t>(fn_ranks.data_ptr<double>());
    void* args[] = {&scores_ptr, &offsets_ptr, &table, &now_ptr, &out_ptr};
    const CUresult r = driver_launch_kernel()(
        reinterpret_cast<CUfunction>(handles[t]), grid, 1, 1, kBlockThreads, 1, 1, 0,
        reinterpret_cast<CUstream>(stream), args, nullptr);
    DEMB_CHECK(r == CUDA_SUCCESS, "dynamicemb (CUDA): launching the score_function of table ", t,
                " failed with CUresult ", static_cast<int>(r),
                "; was it compiled for this device (score_function_cuda.py)?");
  }
  return score_fns_host.ne(0).to(at::kByte).to(scores.device(), /*non_blocking=*/false);
}

}  // namespace cuda_table
}  // namespace dynamicemb
