// The one TORCH_LIBRARY(dynamicemb, m) block: every op schema of the project (STYLE.md rule 5).
//
// Kernels register elsewhere, one TORCH_LIBRARY_IMPL block per backend file (csrc/cpu/*.cpp,
// csrc/cuda/*.cu). Fake (meta) kernels are Python, in the module named by set_python_module.
// Mutated tensors are declared with (x!) aliases and never returned.
#include <torch/library.h>

TORCH_LIBRARY(dynamicemb, m) {
  m.set_python_module("dynamicemb_core.ops.fake");

  // ---------------------------------------------------------------------------------------------
  // Scored hash table (docs/table_design.md). "State" = table_keys, digests, scores, slot_offsets,
  // bucket_caps, policies, sizes.
  //
  // ``check`` (ops taking keys, table ids, slots, inverse or offsets): true runs the data checks
  // (ids in range, offsets ordered) before anything is written. On CUDA they cost one device
  // synchronisation, so callers that built their input themselves (the ScoredHashTable class,
  // the batched module) pass false; the CPU kernels check always, as it costs them no sync.
  //
  // ``pins`` (the evicting ops): an optional (total_slots,) int32 pin count per global slot; a
  // slot whose count is above 0 is never chosen as a victim. ``deterministic``: on CUDA, true (the
  // default) runs the bucket-ordered engine (slot-for-slot the CPU kernels' result), false the
  // key-parallel one (docs/table_design.md, "CUDA insert engines"); CPU is deterministic always.
  // ``unique_keys`` (the same ops): the caller promises that no (table id, key) pair occurs twice
  // in ``keys`` (a grouped lookup's keys after its unique); the key-parallel engine then skips its
  // per-call leader map (on the H200 10-16% of a find_or_insert). A key that does occur twice may
  // then be stored twice: pass it only for keys made distinct. Other engines ignore it.
  //
  // ``counts`` (find, insert, find_or_insert, insert_and_evict): an optional (n,) int64, each >= 0,
  // the accesses key i's touch counts (score_policy.h, touch_count): LFU and COMPOUND counts grow
  // by it, other policies ignore it; 0 places or keeps a key without counting an access (a
  // prefetch). A lookup that deduplicated its keys passes their occurrence counts, so a key seen
  // 3 times in a batch counts 3 (as NVIDIA's DynamicEmb). None: 1 per occurrence.
  // ---------------------------------------------------------------------------------------------

  // Look keys up; with update_score, touch the found ones. -> (slots, found, scores (n,2) internal order)
  m.def(
      "find(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor digests, Tensor(a!) scores, "
      "Tensor slot_offsets, Tensor bucket_caps, Tensor policies, Tensor sizes, Tensor cur_scores, "
      "bool update_score, bool check=True, Tensor? counts=None) -> (Tensor, Tensor, Tensor)");
  // Insert-or-assign keys (evicting from full buckets); input_scores (n,2) replace the policy's words.
  m.def(
      "insert(Tensor keys, Tensor table_ids, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor slot_offsets, Tensor bucket_caps, Tensor policies, Tensor score_fns, "
      "Tensor(d!) sizes, Tensor cur_scores, Tensor? input_scores, bool check=True, Tensor? pins=None, "
      "bool deterministic=True, bool unique_keys=False, Tensor? counts=None) -> Tensor");
  // Find keys, inserting the missing ones. -> (slots, is_new)
  m.def(
      "find_or_insert(Tensor keys, Tensor table_ids, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor slot_offsets, Tensor bucket_caps, Tensor policies, Tensor score_fns, "
      "Tensor(d!) sizes, Tensor cur_scores, bool check=True, Tensor? pins=None, "
      "bool deterministic=True, bool unique_keys=False, Tensor? counts=None) -> (Tensor, Tensor)");
  // Insert and report what was evicted. -> (slots, is_new, ev_keys, ev_slots, ev_scores, ev_table_ids)
  m.def(
      "insert_and_evict(Tensor keys, Tensor table_ids, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor slot_offsets, Tensor bucket_caps, Tensor policies, Tensor score_fns, "
      "Tensor(d!) sizes, Tensor cur_scores, Tensor? input_scores, bool check=True, Tensor? pins=None, "
      "bool deterministic=True, bool unique_keys=False, Tensor? counts=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Remove keys, freeing their slots. -> erased (n,) bool
  m.def(
      "erase(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor(a!) digests, Tensor scores, "
      "Tensor slot_offsets, Tensor bucket_caps, Tensor policies, Tensor(b!) sizes, bool check=True) -> Tensor");
  // Every occupied slot with scores[:, column] >= thresholds[t], by global slot.
  // -> (keys, slots, scores (m,2), table_ids)
  m.def(
      "export_if(Tensor table_keys, Tensor digests, Tensor scores, Tensor slot_offsets, "
      "Tensor bucket_caps, Tensor policies, Tensor sizes, Tensor thresholds, int column) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // Slot-exact placement for replay. -> placed (n,) bool
  m.def(
      "insert_at(Tensor keys, Tensor table_ids, Tensor slots, Tensor(a!) table_keys, "
      "Tensor(b!) digests, Tensor(c!) scores, Tensor slot_offsets, Tensor bucket_caps, "
      "Tensor policies, Tensor(d!) sizes, Tensor input_scores, bool dry_run) -> Tensor");
  // Rows of a (capacity, width) value tensor at local slots; slot -1 gives zeros. -> (n, width)
  m.def("gather_rows(Tensor values, Tensor slots, bool check=True) -> Tensor");
  // Write rows into a (capacity, width) value tensor at local slots; slot -1 skipped, last write wins.
  m.def("scatter_rows(Tensor(a!) values, Tensor slots, Tensor rows, bool check=True) -> ()");
  // The nanosecond clock the table kernels read on like's device when cur_scores[t] < 0 (CPU:
  // steady_clock, CUDA: %globaltimer). -> 0-d int64 on like's device
  m.def("device_clock(Tensor like) -> Tensor");

  // ---------------------------------------------------------------------------------------------
  // Per-table lookup ops (kernels in csrc/{cpu,cuda}/lookup.*): the serving path's pooled gather
  // and the sharded input dist's dedup. The training step runs the grouped ops below.
  // ---------------------------------------------------------------------------------------------
  // Deduplicate keys: (n,) int64 -> (unique keys (u,), inverse (n,), counts (u,)); order unspecified.
  m.def("unique(Tensor keys) -> (Tensor, Tensor, Tensor)");
  // Pool bags of unique rows: (u, D) rows, (n,) inverse, (b+1,) offsets -> (b, D); mode 0 SUM, 1 MEAN.
  m.def("pooled_gather(Tensor embeddings, Tensor inverse, Tensor offsets, Tensor? weights, int mode, bool check=True) -> Tensor");

  // ---------------------------------------------------------------------------------------------
  // Grouped value ops: one call for all tables of a group (csrc/include/dynamicemb/grouped.h).
  // values: the group's flat float32 buffer; meta: (T, 4) int64 [value_offset, row_width, capacity,
  // dim] per table, on values' device; a row is addressed by (table id, slot), slot < 0 = none.
  // Kernels in csrc/{cpu,cuda}/grouped.*; check as above (CUDA: one sync when true).
  // ---------------------------------------------------------------------------------------------
  // Deduplicate (table id, key) pairs -> (unique keys (u,), their table ids (u,), inverse (n,),
  // counts (u,), unique keys per table (T,) on the CPU: read back with u, in the same copy, order).
  // order, with with_order: (n,) the positions grouped by unique pair (pair 0's first), each pair's
  // in input order (what the reduction's sort computes; the CUDA sort gives it for free); else (0,).
  m.def("segmented_unique(Tensor keys, Tensor table_ids, int num_tables, bool with_order=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // segmented_unique of a feature-major batch's keys, each key's table taken from the batch:
  // feature_tables[f] for the indices of feature f's bags [offsets[f*B], offsets[(f+1)*B]) (the
  // offsets are not trusted: every id is one of feature_tables whatever they hold). The fifth
  // output is (T + 3,): the per-table counts, then the numbers of the caller's offsets check,
  // [offsets[0], offsets[-1], bags whose offsets decrease], read back in the same copy.
  m.def("bag_unique(Tensor keys, Tensor offsets, Tensor feature_tables, int batch_size, int num_tables, bool with_order=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // (T, 3) int64 per table on the ids' device: [keys placed new (is_new and slot >= 0), keys left
  // unplaced (slot < 0), sizes[t]] of one placing call (T = sizes.numel(), the hash table's sizes
  // after it: the whole outcome in one tensor for one copy); ids outside [0, T) are not counted.
  m.def("placement_counts(Tensor table_ids, Tensor slots, Tensor is_new, Tensor sizes) -> Tensor");
  // (n, width) rows at (table_ids, slots): each row's first min(width, row_width) elements, zeros after.
  // With inverse (m,): (m, width), row i the pair inverse[i]'s (a sequence output read from the
  // unique pairs without expanding their ids first).
  m.def("grouped_gather(Tensor values, Tensor meta, Tensor table_ids, Tensor slots, int width, bool check=True, Tensor? inverse=None) -> Tensor");
  // Write rows[i, :row_width(t)] at (table_ids[i], slots[i]); slot < 0 skipped; the last duplicate wins.
  m.def("grouped_scatter(Tensor(a!) values, Tensor meta, Tensor table_ids, Tensor slots, Tensor rows, bool check=True) -> ()");
  // New rows in place: row (table_ids[i], slots[i]) (slot < 0 skipped) gets its table's initializer
  // (init (T, 8) float64, csrc/include/dynamicemb/row_init.h) in its embedding, keyed by (seed,
  // table, keys[i], element), and init[t, 7] in its optimizer-state columns. only: (n,) bool, the
  // pairs that get rows (the others skipped as slot -1: an insert's is_new, with no mask op first).
  m.def("grouped_init_rows(Tensor(a!) values, Tensor meta, Tensor table_ids, Tensor slots, Tensor keys, Tensor init, int seed, bool check=True, Tensor? only=None) -> ()");
  // Pool bags of feature-major offsets (F*B+1,) over the unique keys' slots (u,): feature f reads
  // table feature_tables[f] and fills columns [d_offsets[f], d_offsets[f+1]) of the (B, total_dim)
  // output; mode 0 SUM, 1 MEAN.
  m.def("grouped_pooled_gather(Tensor values, Tensor meta, Tensor slots, Tensor inverse, Tensor offsets, Tensor? weights, Tensor feature_tables, Tensor d_offsets, int mode, int batch_size, int total_dim, bool check=True) -> Tensor");
  // Adjoint: -> (num_unique, width) gradient per unique key, zero beyond its table's dim. mode 0 SUM
  // and 1 MEAN read grad_out (B, total_dim) by bag; 2 NONE reads grad_out (n, D) row i for index i.
  m.def("grouped_reduce_grads(Tensor grad_out, Tensor meta, Tensor inverse, Tensor offsets, Tensor? weights, Tensor feature_tables, Tensor d_offsets, int mode, int batch_size, int num_unique, int width, bool check=True) -> Tensor");
  // In place: optimizer (0 SGD, 1 ADAGRAD, 2 ROWWISE_ADAGRAD, 3 ADAM) on the rows at (table_ids,
  // slots) with grads (n, >= dim); the formulas of the per-table updates. rounding_seed >= 0:
  // half-precision rows round stochastically, keyed by (seed, step, table, key, element), so keys
  // (n,), the rows' keys, are then required (the slot a key lives in never changes its rounding);
  // < 0 (the default): to nearest even. float32 rows are never rounded.
  m.def("grouped_update(Tensor(a!) values, Tensor meta, Tensor table_ids, Tensor slots, Tensor grads, int optimizer, float lr, float eps, float beta1, float beta2, float weight_decay, int weight_decay_mode, int step, bool check=True, int rounding_seed=-1, Tensor? keys=None) -> ()");
  // grouped_reduce_grads (width max_dim, the group's widest dim) then grouped_update on the unique
  // keys (table_ids, slots (u,)) in one op. order / key_counts (optional; order needs key_counts):
  // the inverse's positions grouped by key and each key's count (segmented_unique's), which spare
  // the CUDA kernels their sort of the inverse; key_counts alone spares the CPU kernel its counting
  // pass for a one-table group (CUDA: unused without order). The result is the same with or
  // without them. rounding_seed, keys: as grouped_update's.
  m.def("grouped_reduce_update(Tensor(a!) values, Tensor meta, Tensor table_ids, Tensor slots, Tensor grad_out, Tensor inverse, Tensor offsets, Tensor? weights, Tensor feature_tables, Tensor d_offsets, int pool_mode, int batch_size, int max_dim, int optimizer, float lr, float eps, float beta1, float beta2, float weight_decay, int weight_decay_mode, int step, bool check=True, Tensor? order=None, Tensor? key_counts=None, int rounding_seed=-1, Tensor? keys=None) -> ()");
}
