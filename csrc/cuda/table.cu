// CUDA kernels of the scored hash table (docs/table_design.md): find, insert, find_or_insert,
// insert_and_evict, erase, export_if, insert_at, gather_rows, scatter_rows, device_clock. Same
// schemas, same semantics and, for every op, the same results as csrc/cpu/table.cpp.
//
// Per op the kernels live in one header each, in HKV's order (params, kernels, launcher, selector):
//   table_find.cuh    find: a tile of 2 threads per key, 16-byte digest loads, no locks
//   table_upsert.cuh  insert / find_or_insert / insert_and_evict / erase / insert_at: present keys
//                     found and touched key-parallel, the rest sorted by home bucket, one 4-thread
//                     tile per bucket, input order kept (deterministic)
//   table_upsert_parallel.cuh  insert / find_or_insert / insert_and_evict with deterministic=false:
//                     one tile per key, slots claimed lock-free by atomicOr on the protect bits
//   table_export.cuh  export_if: two-pass stream compaction in slot order
//   table_rows.cuh    gather_rows / scatter_rows: dtype-free vector copies
//   score_fn_launch.cuh  the compound score_function, compiled by numba-cuda, run before eviction
// Everything runs on the caller's current stream. The argument checks are csrc/include/dynamicemb/
// table_checks.h, shared with the CPU kernels; the data checks (table id range, slot range) run
// here as one small kernel plus an 8-byte readback, before any write, so that bad input raises the
// CPU kernels' error instead of being skipped silently. That readback is the one device
// synchronisation such an op adds; callers that validated their input pass check=False
// (csrc/ops.cpp), and the kernels then skip an id outside [0, T) and read a slot outside
// [-1, capacity) as empty, never touching memory outside the table.
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "score_fn_launch.cuh"
#include "table_common.cuh"
#include "table_export.cuh"
#include "table_find.cuh"
#include "table_rows.cuh"
#include "table_upsert.cuh"
#include "table_upsert_parallel.cuh"

namespace dynamicemb {
namespace {

using at::Tensor;
using namespace cuda_table;

/** The table state, checked once per call, viewed through raw pointers. */
struct StateView {
  int64_t* table_keys;
  uint8_t* digests;
  int64_t* scores;
  const int64_t* slot_offsets;
  const int64_t* bucket_caps;
  const int64_t* policies;
  int64_t* sizes;
  int64_t num_tables;
  int64_t total_slots;
};

StateView check_state(const char* op, const Tensor& table_keys, const Tensor& digests,
                      const Tensor& scores, const Tensor& slot_offsets, const Tensor& bucket_caps,
                      const Tensor& policies, const Tensor& sizes) {
  const at::Device dev = table_keys.device();
  DEMB_CHECK_VALUE(dev.is_cuda(), "dynamicemb.", op, ": table_keys must be on a CUDA device, got ",
                   dev);
  check_state_args(op, table_keys, digests, scores, slot_offsets, bucket_caps, policies, sizes,
                   dev);
  const int64_t total = table_keys.size(0);
  const int64_t T = bucket_caps.numel();
  return StateView{table_keys.data_ptr<int64_t>(), digests.data_ptr<uint8_t>(),
                   scores.data_ptr<int64_t>(), slot_offsets.data_ptr<int64_t>(),
                   bucket_caps.data_ptr<int64_t>(), policies.data_ptr<int64_t>(),
                   sizes.data_ptr<int64_t>(), T, total};
}

/**
 * keys / table_ids: (n,) int64 on the table's device; contiguous copies. With ``check``, every id
 * must lie in [0, T). Unchecked, a key of an id outside it is treated as missing and never placed.
 */
std::pair<Tensor, Tensor> check_keys(const char* op, const Tensor& keys_in,
                                     const Tensor& table_ids_in, const at::Device& dev, int64_t T,
                                     bool check) {
  check_keys_args(op, keys_in, table_ids_in, dev);
  Tensor table_ids = table_ids_in.contiguous();
  const int64_t i = check ? first_outside(table_ids, 0, T, c10::cuda::getCurrentCUDAStream()) : -1;
  if (i >= 0) raise_bad_table_id(op, i, table_ids[i].item<int64_t>(), T);
  return {keys_in.contiguous(), table_ids};
}

/** Params of the upsert engine with the state and the keys filled in (no scratch). */
UpsertParams upsert_state_params(UpsertMode mode, const Tensor& keys, const Tensor& table_ids,
                                 const StateView& s) {
  UpsertParams p{};
  p.mode = mode;
  p.keys = keys.data_ptr<int64_t>();
  p.table_ids = table_ids.data_ptr<int64_t>();
  p.n = keys.numel();
  p.table_keys = s.table_keys;
  p.digests = s.digests;
  p.scores = s.scores;
  p.slot_offsets = s.slot_offsets;
  p.bucket_caps = s.bucket_caps;
  p.policies = s.policies;
  p.sizes = s.sizes;
  p.num_tables = s.num_tables;
  return p;
}

/** 32-bit protect words of a table of `total_slots` slots. */
inline int64_t protect_words(int64_t total_slots) { return (total_slots + 31) / 32; }

/** upsert_state_params plus zeroed protect bits (erase, insert_at: no other scratch). */
UpsertParams upsert_params(UpsertMode mode, const Tensor& keys, const Tensor& table_ids,
                           const StateView& s, Tensor& protect_bits) {
  UpsertParams p = upsert_state_params(mode, keys, table_ids, s);
  protect_bits = at::zeros({protect_words(s.total_slots)}, keys.options().dtype(at::kInt));
  p.protect_bits = reinterpret_cast<uint32_t*>(protect_bits.data_ptr<int32_t>());
  return p;
}

/** Bytes rounded up to whole 16-byte words. */
inline int64_t whole_vecs(int64_t bytes) { return (bytes + 15) / 16; }

/**
 * The scratch of one inserting call, one allocation of 16-byte words: the call's score per table;
 * for the key-parallel engine its pending list (one 16-byte entry per key at most), its list of
 * leaders placed in empty slots (8 bytes each) and of followers (4 bytes each); the protect bits
 * with the engine's four counts after them (pending, evicted, placed, followers); its leader map.
 * One upsert_init_kernel zeroes the bits and counts, fills the map with -1 and resolves the score:
 * one allocation and one launch before the first pass, where there were four and three (on the
 * H200 the host's launches, not their GPU time, kept the GPU waiting).
 * `p.now` points at the call's score (the first T words); no tensor view of it is made here, as a
 * view is one more host dispatch per call: the score functions' ranks, the one reader that needs
 * a tensor, narrow `scratch` themselves.
 */
void insert_scratch(UpsertParams& p, const StateView& s, const Tensor& policies,
                    const Tensor& cur_scores, bool parallel,
                    const at::TensorOptions& opts, cudaStream_t stream, Tensor& scratch) {
  const int64_t n = p.n;
  const int64_t now_vecs = whole_vecs(s.num_tables * 8);
  const int64_t list_vecs = parallel ? n : 0;
  const int64_t placed_vecs = parallel ? whole_vecs(n * 8) : 0;
  const int64_t follow_vecs = parallel ? whole_vecs(n * 4) : 0;
  const int64_t words = protect_words(s.total_slots);
  const int64_t zero_vecs = whole_vecs((words + 4) * 4);
  const int64_t map_words = parallel && !p.unique_keys ? dedup_words(n) : 0;  // none: distinct keys
  const int64_t map_vecs = whole_vecs(map_words * 4);
  scratch = at::empty(
      {2 * (now_vecs + list_vecs + placed_vecs + follow_vecs + zero_vecs + map_vecs)},
      opts.dtype(at::kLong));
  auto* base = reinterpret_cast<uint4*>(scratch.data_ptr<int64_t>());
  uint4* list = base + now_vecs;
  uint4* placed = list + list_vecs;
  uint4* follow = placed + placed_vecs;
  uint4* zero = follow + follow_vecs;
  uint4* map = zero + zero_vecs;
  p.protect_bits = reinterpret_cast<uint32_t*>(zero);
  p.pending_count = reinterpret_cast<int32_t*>(zero) + words;
  p.evicted_count = p.pending_count + 1;
  if (parallel) {
    p.pending = reinterpret_cast<int64_t*>(list);
    p.placed = reinterpret_cast<uint64_t*>(placed);
    p.placed_count = p.pending_count + 2;
    p.followers = reinterpret_cast<int32_t*>(follow);
    p.follower_count = p.pending_count + 3;
    p.dedup = reinterpret_cast<int32_t*>(map);
    p.dedup_mask = map_words - 1;
  }
  int64_t* now = scratch.data_ptr<int64_t>();
  p.now = now;
  launch_upsert_init(zero, zero_vecs, map, map_vecs, policies.data_ptr<int64_t>(),
                     cur_scores.data_ptr<int64_t>(), s.num_tables, now, stream);
}

/** Outputs of one inserting call (ev_* only for insert_and_evict). */
struct UpsertResult {
  Tensor slots, flag, ev_flag, ev_keys, ev_slots, ev_scores, ev_table_ids;
  // key-parallel insert_and_evict: pending leaders and victims, as read back
  int64_t pending = 0, evicted = 0;
};

/** The key-parallel engine's eviction report, `n` entries (one per pending leader at most). */
void alloc_parallel_evicted(UpsertResult& r, UpsertParams& p, int64_t n,
                            const at::TensorOptions& opts) {
  r.ev_flag = at::empty({n}, opts.dtype(at::kBool));
  r.ev_keys = at::empty({n}, opts);
  r.ev_slots = at::empty({n}, opts);
  r.ev_scores = at::empty({n, 2}, opts);
  r.ev_table_ids = at::empty({n}, opts);
  p.ev_flag = r.ev_flag.data_ptr<bool>();
  p.ev_keys = r.ev_keys.data_ptr<int64_t>();
  p.ev_slots = r.ev_slots.data_ptr<int64_t>();
  p.ev_scores = r.ev_scores.data_ptr<int64_t>();
  p.ev_table_ids = r.ev_table_ids.data_ptr<int64_t>();
}

/**
 * Copies (pending, evicted) into pinned `counts` on `stream`, records an event after the copy and
 * returns it: the host waits for that event (wait_counts), not for the stream, so whatever is
 * queued after the copy keeps the GPU busy meanwhile.
 */
cudaEvent_t copy_counts(const UpsertParams& p, const Tensor& counts, cudaStream_t stream) {
  C10_CUDA_CHECK(cudaMemcpyAsync(counts.data_ptr<int32_t>(), p.pending_count,
                                 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  cudaEvent_t event = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(event, stream));
  return event;
}

/** Waits for copy_counts' event, frees it and reads the counts into `r`. */
void wait_counts(cudaEvent_t event, const Tensor& counts, UpsertResult& r) {
  const cudaError_t waited = cudaEventSynchronize(event);
  C10_CUDA_CHECK(cudaEventDestroy(event));
  C10_CUDA_CHECK(waited);
  r.pending = counts.data_ptr<int32_t>()[0];
  r.evicted = counts.data_ptr<int32_t>()[1];
}

/**
 * The key-parallel insert_and_evict, its counts read while the GPU works: present pass, a copy of
 * the counts, evict pass queued, then the host waits for the copy only. No pending leader means no
 * victim: the finish pass is queued and the call returns. Otherwise a second copy after the evict
 * pass, the finish pass queued behind it, and the host waits for that copy. Every copy into the
 * pinned counts has completed when this returns (the buffer goes back to the allocator).
 */
void run_insert_and_evict_parallel(UpsertResult& r, UpsertParams& p,
                                   const at::TensorOptions& opts, cudaStream_t stream) {
  if (p.n == 0) {
    alloc_parallel_evicted(r, p, 0, opts);
    return;
  }
  check_upsert_parallel(p);
  const Tensor counts = at::empty({2}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  launch_present(p, stream);
  const cudaEvent_t first = copy_counts(p, counts, stream);
  alloc_parallel_evicted(r, p, p.n, opts);  // while the present pass runs
  launch_evict(p, stream);
  wait_counts(first, counts, r);
  if (r.pending == 0) {
    launch_finish(p, stream);
    return;
  }
  const cudaEvent_t second = copy_counts(p, counts, stream);
  launch_finish(p, stream);
  wait_counts(second, counts, r);
}

/**
 * The op's optional per-key access counts (check_counts_arg); with `check`, each is verified >= 0
 * on the device (one synchronisation, as the other data checks).
 */
const int64_t* check_counts_cuda(const char* op, const c10::optional<Tensor>& counts, int64_t n,
                                 const at::Device& dev, bool check) {
  const int64_t* c = check_counts_arg(op, counts, n, dev);
  if (c != nullptr && check && n > 0) {
    DEMB_CHECK_VALUE(counts->min().item<int64_t>() >= 0, "dynamicemb.", op,
                     " (CUDA): counts must be >= 0 (each key's accesses), got a negative one");
  }
  return c;
}

/**
 * The shared body of insert, find_or_insert and insert_and_evict: the key-parallel engine, or with
 * ``deterministic`` the bucket-ordered one (slot-for-slot the CPU kernels' result).
 */
UpsertResult run_insert(const char* op, UpsertMode mode, const Tensor& keys_in,
                        const Tensor& table_ids_in, const Tensor& table_keys,
                        const Tensor& digests, const Tensor& scores, const Tensor& slot_offsets,
                        const Tensor& bucket_caps, const Tensor& policies, const Tensor& score_fns,
                        const Tensor& sizes, const Tensor& cur_scores_in,
                        const c10::optional<Tensor>& input_scores_in, bool check,
                        const c10::optional<Tensor>& pins, bool deterministic,
                        bool unique_keys, const c10::optional<Tensor>& counts = c10::nullopt) {
  const StateView s = check_state(op, table_keys, digests, scores, slot_offsets, bucket_caps,
                                  policies, sizes);
  const at::Device dev = table_keys.device();
  const c10::cuda::CUDAGuard guard(dev);
  auto [keys, table_ids] = check_keys(op, keys_in, table_ids_in, dev, s.num_tables, check);
  check_per_table_arg(op, cur_scores_in, "cur_scores", s.num_tables, dev);
  const Tensor cur_scores = cur_scores_in.contiguous();
  DEMB_CHECK_TYPE(score_fns.scalar_type() == at::kLong && score_fns.dim() == 1 &&
                       score_fns.size(0) == s.num_tables,
                   "dynamicemb.", op, " (CUDA): score_fns must be (", s.num_tables,
                   ",) int64 kernel handles, got ", score_fns.sizes(), " ", score_fns.scalar_type());
  Tensor input_scores;
  if (input_scores_in.has_value()) {
    check_input_scores_arg(op, *input_scores_in, keys.size(0), dev);
    input_scores = input_scores_in->contiguous();
  }
  const int32_t* pin_counts = check_pins_arg(op, pins, s.total_slots, dev);
  const int64_t* touch_counts = check_counts_cuda(op, counts, keys.size(0), dev, check);
  const int64_t n = keys.numel();
  const auto opts = keys.options();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  UpsertParams p = upsert_state_params(mode, keys, table_ids, s);
  p.unique_keys = unique_keys && !deterministic;
  Tensor scratch;
  insert_scratch(p, s, policies, cur_scores, !deterministic, opts, stream, scratch);
  p.pins = pin_counts;
  p.input_scores = input_scores.defined() ? input_scores.data_ptr<int64_t>() : nullptr;
  p.counts = touch_counts;

  // Score functions: handles are read on the host (a CPU score_fns costs no synchronisation).
  const Tensor fns_host = score_fns.device().is_cpu() ? score_fns.contiguous() : score_fns.cpu();
  Tensor fn_ranks, has_fn;
  const int64_t* handles = fns_host.data_ptr<int64_t>();  // a plain loop: no tensor ops per call
  if (n > 0 && std::any_of(handles, handles + s.num_tables, [](int64_t h) { return h != 0; })) {
    fn_ranks = at::empty({s.total_slots}, opts.dtype(at::kDouble));
    has_fn = compute_fn_ranks(fns_host, scores, slot_offsets, scratch.narrow(0, 0, s.num_tables),
                              fn_ranks, stream);
    p.fn_scores = fn_ranks.data_ptr<double>();
    p.has_fn = has_fn.data_ptr<uint8_t>();
  }

  UpsertResult r;
  r.slots = at::empty({n}, opts);
  r.flag = at::empty({n}, opts.dtype(at::kBool));
  p.out_slots = r.slots.data_ptr<int64_t>();
  p.out_flag = r.flag.data_ptr<bool>();
  if (mode == UpsertMode::kInsertAndEvict && !deterministic) {
    run_insert_and_evict_parallel(r, p, opts, stream);
  } else if (mode == UpsertMode::kInsertAndEvict) {
    r.ev_flag = at::zeros({n}, opts.dtype(at::kBool));
    r.ev_keys = at::empty({n}, opts);
    r.ev_slots = at::empty({n}, opts);
    r.ev_scores = at::empty({n, 2}, opts);
    p.ev_flag = r.ev_flag.data_ptr<bool>();
    p.ev_keys = r.ev_keys.data_ptr<int64_t>();
    p.ev_slots = r.ev_slots.data_ptr<int64_t>();
    p.ev_scores = r.ev_scores.data_ptr<int64_t>();
    select_upsert(p, s.total_slots, opts, stream);
  } else if (deterministic) {
    select_upsert(p, s.total_slots, opts, stream);
  } else {
    select_upsert_parallel(p, stream);
  }
  return r;
}

/**
 * Shrinks a tensor this call allocated, and that nothing else references yet, to its first `rows`
 * rows in place: the same result as narrow() without a host dispatch and a new tensor per output.
 * The storage keeps its size, as a view's would.
 */
void shrink_fresh_output(const Tensor& t, int64_t rows) {
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] = rows;
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
}

/**
 * The key-parallel engine's evictions: entry w of the pending list reports its victim at w. When
 * every pending leader evicted (no holes), the report is the first `evicted` entries as they are
 * (the fresh outputs shrunk in place); otherwise the entries that evicted are compacted (one more
 * read of the count).
 */
std::tuple<Tensor, Tensor, Tensor, Tensor> pending_evicted(const UpsertResult& r,
                                                            cudaStream_t stream) {
  if (r.pending == r.evicted) {
    for (const Tensor* t : {&r.ev_keys, &r.ev_slots, &r.ev_scores, &r.ev_table_ids}) {
      shrink_fresh_output(*t, r.evicted);
    }
    return {r.ev_keys, r.ev_slots, r.ev_scores, r.ev_table_ids};
  }
  return compact_evicted(r.ev_flag.narrow(0, 0, r.pending), r.ev_keys, r.ev_slots, r.ev_scores,
                         r.ev_table_ids, stream);
}

// ------------------------------------------------------------------------------------------------
// Ops
// ------------------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> find_cuda(const Tensor& keys_in, const Tensor& table_ids_in,
                                             const Tensor& table_keys, const Tensor& digests,
                                             const Tensor& scores, const Tensor& slot_offsets,
                                             const Tensor& bucket_caps, const Tensor& policies,
                                             const Tensor& sizes, const Tensor& cur_scores_in,
                                             bool update_score, bool check,
                                             const c10::optional<Tensor>& counts) {
  const StateView s = check_state("find", table_keys, digests, scores, slot_offsets, bucket_caps,
                                  policies, sizes);
  const at::Device dev = table_keys.device();
  const c10::cuda::CUDAGuard guard(dev);
  auto [keys, table_ids] = check_keys("find", keys_in, table_ids_in, dev, s.num_tables, check);
  check_per_table_arg("find", cur_scores_in, "cur_scores", s.num_tables, dev);
  const Tensor cur_scores = cur_scores_in.contiguous();
  const int64_t n = keys.numel();
  const auto opts = keys.options();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  Tensor slots = at::empty({n}, opts);
  Tensor found = at::empty({n}, opts.dtype(at::kBool));
  Tensor out_scores = at::empty({n, 2}, opts);
  FindParams p{keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n, s.table_keys,
               s.digests, s.scores, s.slot_offsets, s.bucket_caps, s.policies, s.num_tables,
               nullptr, update_score, slots.data_ptr<int64_t>(), found.data_ptr<bool>(),
               out_scores.data_ptr<int64_t>(), nullptr,
               check_counts_cuda("find", counts, n, dev, check)};
  Tensor now, global;
  if (update_score) {
    now = resolve_now_cuda(policies, cur_scores);
    global = at::empty({n}, opts);
    p.now = now.data_ptr<int64_t>();
    p.out_global = global.data_ptr<int64_t>();
  }
  select_find(p, stream);
  return {slots, found, out_scores};
}

Tensor insert_cuda(const Tensor& keys, const Tensor& table_ids, const Tensor& table_keys,
                   const Tensor& digests, const Tensor& scores, const Tensor& slot_offsets,
                   const Tensor& bucket_caps, const Tensor& policies, const Tensor& score_fns,
                   const Tensor& sizes, const Tensor& cur_scores,
                   const c10::optional<Tensor>& input_scores, bool check,
                   const c10::optional<Tensor>& pins, bool deterministic, bool unique_keys,
                   const c10::optional<Tensor>& counts) {
  return run_insert("insert", UpsertMode::kInsert, keys, table_ids, table_keys, digests, scores,
                    slot_offsets, bucket_caps, policies, score_fns, sizes, cur_scores,
                    input_scores, check, pins, deterministic, unique_keys, counts)
      .slots;
}

std::tuple<Tensor, Tensor> find_or_insert_cuda(const Tensor& keys, const Tensor& table_ids,
                                               const Tensor& table_keys, const Tensor& digests,
                                               const Tensor& scores, const Tensor& slot_offsets,
                                               const Tensor& bucket_caps, const Tensor& policies,
                                               const Tensor& score_fns, const Tensor& sizes,
                                               const Tensor& cur_scores, bool check,
                                               const c10::optional<Tensor>& pins,
                                               bool deterministic, bool unique_keys,
                                               const c10::optional<Tensor>& counts) {
  UpsertResult r = run_insert("find_or_insert", UpsertMode::kFindOrInsert, keys, table_ids,
                              table_keys, digests, scores, slot_offsets, bucket_caps, policies,
                              score_fns, sizes, cur_scores, c10::nullopt, check, pins,
                              deterministic, unique_keys, counts);
  return {r.slots, r.flag};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> insert_and_evict_cuda(
    const Tensor& keys, const Tensor& table_ids, const Tensor& table_keys, const Tensor& digests,
    const Tensor& scores, const Tensor& slot_offsets, const Tensor& bucket_caps,
    const Tensor& policies, const Tensor& score_fns, const Tensor& sizes, const Tensor& cur_scores,
    const c10::optional<Tensor>& input_scores, bool check, const c10::optional<Tensor>& pins,
    bool deterministic, bool unique_keys, const c10::optional<Tensor>& counts) {
  UpsertResult r = run_insert("insert_and_evict", UpsertMode::kInsertAndEvict, keys, table_ids,
                              table_keys, digests, scores, slot_offsets, bucket_caps, policies,
                              score_fns, sizes, cur_scores, input_scores, check, pins,
                              deterministic, unique_keys, counts);
  // Evictions (m depends on data: the host reads a count): deterministic, in input order of the
  // keys that caused them (compact_evicted reads it); key-parallel, in pending-list order (the
  // counts were read inside run_insert, with the finish pass still queued).
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (!deterministic) {
    auto [ek, es, ew, et] = pending_evicted(r, stream);
    return {r.slots, r.flag, ek, es, ew, et};
  }
  auto [ek, es, ew, et] = compact_evicted(r.ev_flag, r.ev_keys, r.ev_slots, r.ev_scores,
                                          table_ids.contiguous(), stream);
  return {r.slots, r.flag, ek, es, ew, et};
}

Tensor erase_cuda(const Tensor& keys_in, const Tensor& table_ids_in, const Tensor& table_keys,
                  const Tensor& digests, const Tensor& scores, const Tensor& slot_offsets,
                  const Tensor& bucket_caps, const Tensor& policies, const Tensor& sizes, bool check) {
  const StateView s = check_state("erase", table_keys, digests, scores, slot_offsets, bucket_caps,
                                  policies, sizes);
  const at::Device dev = table_keys.device();
  const c10::cuda::CUDAGuard guard(dev);
  auto [keys, table_ids] = check_keys("erase", keys_in, table_ids_in, dev, s.num_tables, check);
  const int64_t n = keys.numel();
  Tensor protect_bits;
  UpsertParams p = upsert_params(UpsertMode::kErase, keys, table_ids, s, protect_bits);
  Tensor scratch = at::empty({n}, keys.options());
  Tensor erased = at::empty({n}, keys.options().dtype(at::kBool));
  p.out_slots = scratch.data_ptr<int64_t>();
  p.out_flag = erased.data_ptr<bool>();
  select_upsert(p, s.total_slots, keys.options(), c10::cuda::getCurrentCUDAStream());
  return erased;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> export_if_cuda(
    const Tensor& table_keys, const Tensor& digests, const Tensor& scores,
    const Tensor& slot_offsets, const Tensor& bucket_caps, const Tensor& policies,
    const Tensor& sizes, const Tensor& thresholds_in, int64_t column) {
  const StateView s = check_state("export_if", table_keys, digests, scores, slot_offsets,
                                  bucket_caps, policies, sizes);
  const at::Device dev = table_keys.device();
  const c10::cuda::CUDAGuard guard(dev);
  check_per_table_arg("export_if", thresholds_in, "thresholds", s.num_tables, dev);
  const Tensor thresholds = thresholds_in.contiguous();
  DEMB_CHECK_VALUE(column == 0 || column == 1,
                    "dynamicemb.export_if: column must be 0 or 1, got ", column);
  ExportParams p{};
  p.table_keys = s.table_keys;
  p.digests = s.digests;
  p.scores = s.scores;
  p.slot_offsets = s.slot_offsets;
  p.num_tables = s.num_tables;
  p.total_slots = s.total_slots;
  p.thresholds = thresholds.data_ptr<int64_t>();
  p.column = column;
  auto [k, sl, sc, t] = select_export(p, table_keys.options(), c10::cuda::getCurrentCUDAStream());
  return {k, sl, sc, t};
}

Tensor insert_at_cuda(const Tensor& keys_in, const Tensor& table_ids_in, const Tensor& slots_in,
                      const Tensor& table_keys, const Tensor& digests, const Tensor& scores,
                      const Tensor& slot_offsets, const Tensor& bucket_caps,
                      const Tensor& policies, const Tensor& sizes, const Tensor& input_scores_in,
                      bool dry_run) {
  const StateView s = check_state("insert_at", table_keys, digests, scores, slot_offsets,
                                  bucket_caps, policies, sizes);
  const at::Device dev = table_keys.device();
  const c10::cuda::CUDAGuard guard(dev);
  auto [keys, table_ids] = check_keys("insert_at", keys_in, table_ids_in, dev, s.num_tables, true);
  check_table_arg(slots_in, "insert_at", "slots", at::kLong, 1, dev);
  DEMB_CHECK_VALUE(slots_in.size(0) == keys.size(0), "dynamicemb.insert_at: slots must have ",
                   keys.size(0), " entries like keys, got ", slots_in.size(0));
  const Tensor slots = slots_in.contiguous();
  check_input_scores_arg("insert_at", input_scores_in, keys.size(0), dev);
  const Tensor input_scores = input_scores_in.contiguous();
  const int64_t n = keys.numel();
  Tensor protect_bits;
  UpsertParams p = upsert_params(UpsertMode::kInsertAt, keys, table_ids, s, protect_bits);
  Tensor scratch = at::empty({n}, keys.options());
  Tensor placed = at::empty({n}, keys.options().dtype(at::kBool));
  p.in_slots = slots.data_ptr<int64_t>();
  p.input_scores = input_scores.data_ptr<int64_t>();
  p.dry_run = dry_run;
  p.out_slots = scratch.data_ptr<int64_t>();
  p.out_flag = placed.data_ptr<bool>();
  select_upsert(p, s.total_slots, keys.options(), c10::cuda::getCurrentCUDAStream());
  return placed;
}

/**
 * values and slots of gather_rows / scatter_rows; with ``check``, every slot in [-1, capacity).
 * Unchecked, a slot outside it reads as zeros and is not written (the kernels' bound).
 */
Tensor check_rows(const char* op, const Tensor& values, const Tensor& slots_in, bool check) {
  DEMB_CHECK_VALUE(values.is_cuda(), "dynamicemb.", op,
                   ": values must be on a CUDA device like slots, got ", values.device());
  check_rows_args(op, values, slots_in);
  Tensor slots = slots_in.contiguous();
  const int64_t cap = values.size(0);
  const int64_t i = check ? first_outside(slots, -1, cap, c10::cuda::getCurrentCUDAStream()) : -1;
  if (i >= 0) raise_bad_slot(op, i, slots[i].item<int64_t>(), cap);
  return slots;
}

Tensor gather_rows_cuda(const Tensor& values, const Tensor& slots_in, bool check) {
  const c10::cuda::CUDAGuard guard(values.device());
  const Tensor slots = check_rows("gather_rows", values, slots_in, check);
  Tensor out = at::empty({slots.numel(), values.size(1)}, values.options());
  select_gather_rows(values, slots, out, c10::cuda::getCurrentCUDAStream());
  return out;
}

void scatter_rows_cuda(const Tensor& values, const Tensor& slots_in, const Tensor& rows_in, bool check) {
  const c10::cuda::CUDAGuard guard(values.device());
  check_scatter_rows_arg(values, slots_in, rows_in);
  const Tensor slots = check_rows("scatter_rows", values, slots_in, check);
  Tensor v = values;  // the schema declares the mutation (a!)
  select_scatter_rows(v, slots, rows_in.contiguous(), c10::cuda::getCurrentCUDAStream());
}

/** One thread writes the clock the table kernels read (global_timer_ns, %globaltimer). */
__global__ void device_clock_kernel(int64_t* __restrict__ out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = global_timer_ns();
}

Tensor device_clock_cuda(const Tensor& like) {
  DEMB_CHECK_VALUE(like.is_cuda(), "dynamicemb.device_clock (CUDA): like must be on a CUDA "
                    "device, got ", like.device());
  const c10::cuda::CUDAGuard guard(like.device());
  Tensor out = at::empty({}, like.options().dtype(at::kLong));
  device_clock_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(out.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace dynamicemb

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("find", &dynamicemb::find_cuda);
  m.impl("insert", &dynamicemb::insert_cuda);
  m.impl("find_or_insert", &dynamicemb::find_or_insert_cuda);
  m.impl("insert_and_evict", &dynamicemb::insert_and_evict_cuda);
  m.impl("erase", &dynamicemb::erase_cuda);
  m.impl("export_if", &dynamicemb::export_if_cuda);
  m.impl("insert_at", &dynamicemb::insert_at_cuda);
  m.impl("gather_rows", &dynamicemb::gather_rows_cuda);
  m.impl("scatter_rows", &dynamicemb::scatter_rows_cuda);
  m.impl("device_clock", &dynamicemb::device_clock_cuda);
}
