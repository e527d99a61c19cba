// segmented_unique, bag_unique and placement_counts on CUDA: one stable radix sort of a
// (table id, key) word and one readback.
// Part of csrc/cuda/grouped.cu's one translation unit (as csrc/cuda/table.cu's headers): included
// there only.
#pragma once

#include "grouped_common.cuh"

namespace dynamicemb {
namespace {

using namespace grouped;

// ---- segmented unique: one stable radix sort of a (table id, key) word, one readback ----

using UniqueResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The sort word of a pair: the key with its table id mixed in (a bijection of the key for each
// table; table 0's word is the key itself). Two different pairs share a word only when their
// tables differ and their keys differ by exactly the two tables' mixes.
constexpr uint64_t kTableMix = 0x9E3779B97F4A7C15ULL;
constexpr int kSharedTables = 256;
constexpr int kUniqueThreads = 256;
// The unique's one readback: [per-table counts (T), the caller's numbers (E), u, clash]; the
// counts and numbers first, so the host's answer is a prefix of it (outputs start at offset 0).
// bag_unique's E = 3: the offsets check's numbers.
constexpr int64_t kCheckNumbers = 3;

inline int64_t unique_blocks(int64_t n) { return (n + kUniqueThreads - 1) / kUniqueThreads; }

__device__ inline int64_t pair_word(int64_t key, int64_t t) {
  return static_cast<int64_t>(static_cast<uint64_t>(key) ^ (static_cast<uint64_t>(t) * kTableMix));
}

/// One thread per sorted position: the inverse of its input position, and at each run head the
/// run's pair (read at its input position through ``order``) and where the run starts (no
/// atomics: a run's count is the distance to the next start). ``rank``: inclusive count of run
/// heads (pair id + 1).
__global__ void runs_kernel(const int64_t* __restrict__ order, const int64_t* __restrict__ keys,
                            const int64_t* __restrict__ tids, const int64_t* __restrict__ rank,
                            const int64_t* __restrict__ head, int64_t n,
                            int64_t* __restrict__ inverse, int64_t* __restrict__ uk,
                            int64_t* __restrict__ ut, int64_t* __restrict__ run_start) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t g = rank[i] - 1;
  const int64_t at = order[i];
  inverse[at] = g;
  if (head[i]) {
    uk[g] = keys[at];
    ut[g] = tids[at];
    run_start[g] = i;
  }
}

/// Each pair's count, the distance between run starts; ``u`` is read on the device (the kernel
/// is queued before the host knows it).
__global__ void run_counts_kernel(const int64_t* __restrict__ run_start,
                                  const int64_t* __restrict__ u_dev, int64_t n,
                                  int64_t* __restrict__ counts) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t u = *u_dev;
  if (g >= u) return;
  counts[g] = (g + 1 < u ? run_start[g + 1] : n) - run_start[g];
}

/// The unique's outputs in buffers of n rows (u <= n), filled before the readback says u (each
/// its own allocation: an op's outputs start at storage offset 0, as its fake kernel's do).
struct UniqueTail {
  at::Tensor inverse, uk, ut, counts;
};

/// Queue the unique's last two kernels before its readback (the host then only cuts the
/// buffers to u rows): ``order`` sorted position -> input position, equal pairs adjacent;
/// ``rank``/``head`` (n,) int64 over the sorted positions; ``u_dev`` the unique count on the
/// device.
UniqueTail launch_tail(const at::Tensor& order, const at::Tensor& keys, const at::Tensor& tids,
                       const at::Tensor& rank, const at::Tensor& head, const int64_t* u_dev) {
  const int64_t n = order.numel();
  const auto opts = keys.options();
  UniqueTail tail{at::empty({n}, opts), at::empty({n}, opts), at::empty({n}, opts),
                  at::empty({n}, opts)};
  auto run_start = at::empty({n}, opts);
  auto stream = at::cuda::getCurrentCUDAStream();
  runs_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      order.data_ptr<int64_t>(), keys.data_ptr<int64_t>(), tids.data_ptr<int64_t>(),
      rank.data_ptr<int64_t>(), head.data_ptr<int64_t>(), n, tail.inverse.data_ptr<int64_t>(),
      tail.uk.data_ptr<int64_t>(), tail.ut.data_ptr<int64_t>(), run_start.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  run_counts_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      run_start.data_ptr<int64_t>(), u_dev, n, tail.counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return tail;
}

UniqueResult finish_unique(const UniqueTail& tail, int64_t u, const at::Tensor& host_counts,
                           const at::Tensor& order, bool with_order) {
  return {tail.uk.narrow(0, 0, u), tail.ut.narrow(0, 0, u), tail.inverse,
          tail.counts.narrow(0, 0, u), host_counts, with_order ? order : order.new_empty({0})};
}

/// The exact form: sort by key, then stably by table id (two radix sorts); used when the one-word
/// form finds two different pairs with the same word. ``host_extra``: numbers (CPU) appended to
/// the per-table counts.
UniqueResult segmented_unique_two_sorts(const at::Tensor& k, const at::Tensor& t,
                                        int64_t num_tables, bool with_order,
                                        const at::Tensor& host_extra) {
  const int64_t n = k.numel();
  const auto opts = k.options();
  const auto by_key = at::sort(k, /*stable=*/true, 0, false);
  at::Tensor order = std::get<1>(by_key);
  at::Tensor sk = std::get<0>(by_key);
  at::Tensor st;
  if (num_tables > 1) {
    const auto by_table = at::sort(t.index_select(0, order), /*stable=*/true, 0, false);
    st = std::get<0>(by_table);
    order = order.index_select(0, std::get<1>(by_table));
    sk = k.index_select(0, order);
  } else {
    st = t.index_select(0, order);
  }
  auto head = at::ones({n}, opts.dtype(at::kBool));
  if (n > 1) {
    head.narrow(0, 1, n - 1)
        .copy_((sk.narrow(0, 1, n - 1) != sk.narrow(0, 0, n - 1)) |
               (st.narrow(0, 1, n - 1) != st.narrow(0, 0, n - 1)));
  }
  const auto rank = at::cumsum(head, 0, at::kLong);
  const auto heads = head.to(at::kLong);
  auto per_table = at::zeros({num_tables}, opts);
  per_table.index_add_(0, st, heads);
  const auto small = at::cat({per_table, rank.narrow(0, n - 1, 1)});  // [per-table counts, u]
  const UniqueTail tail =
      launch_tail(order, k, t, rank, heads, small.data_ptr<int64_t>() + num_tables);
  auto host = small.cpu();
  const int64_t u = host.data_ptr<int64_t>()[num_tables];
  auto counts = host_extra.defined() ? at::cat({host.narrow(0, 0, num_tables), host_extra})
                                     : host.narrow(0, 0, num_tables);
  return finish_unique(tail, u, counts, order, with_order);
}

__global__ void pair_word_kernel(const int64_t* __restrict__ keys,
                                 const int64_t* __restrict__ tids, int64_t n,
                                 int64_t* __restrict__ words) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  words[i] = pair_word(keys[i], tids[i]);
}

/// Over the sorted words: run heads (1 where a word differs from the previous one), their number
/// (``num_heads``: the unique count, one add per block), the number of pairs per table
/// (shared-memory counts per block when the tables are few), and a flag set when one word holds
/// two different pairs (equal words of one table are one pair: the word is a bijection of the
/// key per table, so a run holds two pairs only where its table id changes). Table ids are read
/// at the input positions (``order``).
__global__ void run_heads_kernel(const int64_t* __restrict__ words,
                                 const int64_t* __restrict__ order,
                                 const int64_t* __restrict__ tids, int64_t n, int64_t num_tables,
                                 int64_t* __restrict__ head, unsigned long long* __restrict__ num_heads,
                                 unsigned long long* __restrict__ per_table,
                                 int64_t* __restrict__ clash) {
  __shared__ unsigned int counts[kSharedTables];
  const bool shared = num_tables <= kSharedTables;
  if (shared) {
    for (int64_t j = threadIdx.x; j < num_tables; j += blockDim.x) counts[j] = 0;
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  bool h = false;
  if (i < n) {
    h = i == 0 || words[i] != words[i - 1];
    head[i] = h ? 1 : 0;
    const int64_t t = tids[order[i]];
    if (!h && t != tids[order[i - 1]]) *clash = 1;
    if (h && t >= 0 && t < num_tables) {
      if (shared) {
        atomicAdd(&counts[t], 1u);
      } else {
        atomicAdd(&per_table[t], 1ULL);
      }
    }
  }
  const int block_heads = __syncthreads_count(h);  // also the barrier before the table counts
  if (threadIdx.x == 0 && block_heads) {
    atomicAdd(num_heads, static_cast<unsigned long long>(block_heads));
  }
  if (shared) {
    for (int64_t j = threadIdx.x; j < num_tables; j += blockDim.x) {
      if (counts[j]) atomicAdd(&per_table[j], static_cast<unsigned long long>(counts[j]));
    }
  }
}

/// The unique over sort words (k, t: the (n,) keys and table ids, n > 0). ``small``: the zeroed
/// readback, [per-table counts (T), ``num_extra`` numbers already written on the device, u,
/// clash]. Every kernel is queued before the one readback.
UniqueResult unique_by_words(const at::Tensor& k, const at::Tensor& t, const at::Tensor& words,
                             const at::Tensor& small, int64_t num_tables, bool with_order,
                             int64_t num_extra) {
  const int64_t n = k.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  // One stable sort: equal pairs end up adjacent, each run in input order.
  const auto by_word = at::sort(words, /*stable=*/true, 0, false);
  const auto& sw = std::get<0>(by_word);
  const auto order = std::get<1>(by_word);
  auto head = at::empty({n}, k.options());
  int64_t* sp = small.data_ptr<int64_t>();
  int64_t* u_at = sp + num_tables + num_extra;  // then clash at u_at + 1
  run_heads_kernel<<<unique_blocks(n), kUniqueThreads, 0, stream>>>(
      sw.data_ptr<int64_t>(), order.data_ptr<int64_t>(), t.data_ptr<int64_t>(), n, num_tables,
      head.data_ptr<int64_t>(), reinterpret_cast<unsigned long long*>(u_at),
      reinterpret_cast<unsigned long long*>(sp), u_at + 1);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto rank = at::cumsum(head, 0);  // pair id + 1 at each sorted position
  const UniqueTail tail = launch_tail(order, k, t, rank, head, u_at);
  const auto host = small.cpu();  // the one readback
  const int64_t* hp = host.data_ptr<int64_t>() + num_tables + num_extra;  // u, clash
  if (hp[1] != 0) {
    const at::Tensor extra = num_extra ? host.narrow(0, num_tables, num_extra) : at::Tensor();
    return segmented_unique_two_sorts(k, t, num_tables, with_order, extra);
  }
  return finish_unique(tail, hp[0], host.narrow(0, 0, num_tables + num_extra), order, with_order);
}

UniqueResult segmented_unique_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, bool with_order) {
  const char* op = "segmented_unique";
  check_segmented_unique(keys, table_ids, num_tables, op);
  const at::cuda::CUDAGuard guard(keys.device());
  const auto k = keys.contiguous();
  const auto t = table_ids.contiguous();
  const int64_t n = k.numel();
  const auto opts = k.options();
  if (n == 0) {
    return {k.new_empty({0}), k.new_empty({0}), k.new_empty({0}), k.new_empty({0}),
            at::zeros({num_tables}, opts.device(at::kCPU)), k.new_empty({0})};
  }
  at::Tensor words = k;  // one table: the words are the keys
  if (num_tables > 1) {
    words = at::empty({n}, opts);
    pair_word_kernel<<<unique_blocks(n), kUniqueThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        k.data_ptr<int64_t>(), t.data_ptr<int64_t>(), n, words.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return unique_by_words(k, t, words, at::zeros({num_tables + 2}, opts), num_tables, with_order,
                         0);
}

// ---- bag_unique: table ids from the batch's offsets, then the segmented unique ----

/// One thread per index: its table (a binary search over the features' first offsets) and its
/// sort word; and the offsets check's numbers (``check`` zeroed before the launch): first,
/// last, decreasing bags.
__global__ void bag_words_kernel(const int64_t* __restrict__ keys,
                                 const int64_t* __restrict__ offsets,
                                 const int64_t* __restrict__ ft, int64_t F, int64_t B, int64_t n,
                                 int64_t num_bags, int64_t* __restrict__ tids,
                                 int64_t* __restrict__ words,
                                 unsigned long long* __restrict__ check) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) {
    check[0] = static_cast<unsigned long long>(offsets[0]);
    check[1] = static_cast<unsigned long long>(offsets[num_bags]);
  }
  if (i < num_bags && offsets[i + 1] < offsets[i]) atomicAdd(&check[2], 1ULL);
  if (i >= n) return;
  // The last feature whose first index is <= i (features with no index share their start with
  // the next one, so the search passes over them). Offsets are not trusted: the id stays one of
  // feature_tables whatever they hold.
  int64_t lo = 0, hi = F - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid * B] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t t = ft[lo];
  tids[i] = t;
  words[i] = pair_word(keys[i], t);
}

UniqueResult bag_unique_cuda(const at::Tensor& keys, const at::Tensor& offsets,
                             const at::Tensor& feature_tables, int64_t batch_size,
                             int64_t num_tables, bool with_order) {
  const char* op = "bag_unique";
  check_bag_unique(keys, offsets, feature_tables, batch_size, num_tables, op);
  const at::cuda::CUDAGuard guard(keys.device());
  const auto k = keys.contiguous();
  const auto off = offsets.contiguous();
  const auto ft = feature_tables.contiguous();
  const int64_t n = k.numel();
  const auto opts = k.options();
  const int64_t num_bags = off.numel() - 1;
  auto small = at::zeros({num_tables + kCheckNumbers + 2}, opts);
  auto ids = at::empty({2, n}, opts);  // table ids, sort words
  const auto t = ids.select(0, 0);
  const auto words = ids.select(0, 1);
  const int64_t threads_needed = std::max<int64_t>({n, num_bags, 1});
  bag_words_kernel<<<unique_blocks(threads_needed), kUniqueThreads, 0,
                     at::cuda::getCurrentCUDAStream()>>>(
      k.data_ptr<int64_t>(), off.data_ptr<int64_t>(), ft.data_ptr<int64_t>(), ft.numel(),
      batch_size, n, num_bags, t.data_ptr<int64_t>(), words.data_ptr<int64_t>(),
      reinterpret_cast<unsigned long long*>(small.data_ptr<int64_t>() + num_tables));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (n == 0) {
    const auto host = small.cpu();
    return {k.new_empty({0}), k.new_empty({0}), k.new_empty({0}), k.new_empty({0}),
            host.narrow(0, 0, num_tables + kCheckNumbers), k.new_empty({0})};
  }
  return unique_by_words(k, t, words, small, num_tables, with_order, kCheckNumbers);
}

// ---- per-table placement counts: shared-memory counts per block, one global add per table ----

__global__ void placement_counts_kernel(const int64_t* __restrict__ tids,
                                        const int64_t* __restrict__ slots,
                                        const bool* __restrict__ is_new,
                                        const int64_t* __restrict__ sizes, int64_t n, int64_t T,
                                        unsigned long long* __restrict__ out) {
  __shared__ unsigned int counts[2 * kSharedTables];
  const bool shared = T <= kSharedTables;
  if (blockIdx.x == 0) {  // the sizes column: plain stores, no other thread writes it
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
      out[j * 3 + 2] = static_cast<unsigned long long>(sizes[j]);
    }
  }
  if (shared) {
    for (int64_t j = threadIdx.x; j < 2 * T; j += blockDim.x) counts[j] = 0;
  }
  __syncthreads();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = tids[i];
    if (t < 0 || t >= T) continue;
    const int64_t col = slots[i] < 0 ? 1 : (is_new[i] ? 0 : -1);
    if (col < 0) continue;
    if (shared) {
      atomicAdd(&counts[t * 2 + col], 1u);
    } else {
      atomicAdd(&out[t * 3 + col], 1ULL);
    }
  }
  __syncthreads();
  if (shared) {
    for (int64_t j = threadIdx.x; j < 2 * T; j += blockDim.x) {
      if (counts[j]) {
        atomicAdd(&out[(j / 2) * 3 + j % 2], static_cast<unsigned long long>(counts[j]));
      }
    }
  }
}

at::Tensor placement_counts_cuda(const at::Tensor& table_ids, const at::Tensor& slots,
                                 const at::Tensor& is_new, const at::Tensor& sizes) {
  const char* op = "placement_counts";
  check_placement_counts(table_ids, slots, is_new, sizes, op);
  const at::cuda::CUDAGuard guard(table_ids.device());
  const auto tid = table_ids.contiguous();
  const auto sl = slots.contiguous();
  const auto nw = is_new.contiguous();
  const auto sz = sizes.contiguous();
  const int64_t num_tables = sz.numel();
  auto out = at::zeros({num_tables, 3}, tid.options());
  const int64_t n = sl.numel();
  const int threads = 256;
  // A grid-stride loop over a bounded grid: few blocks, so few global adds per table (one block
  // at least: it writes the sizes column).
  const int64_t blocks = std::max<int64_t>(std::min<int64_t>((n + threads - 1) / threads, 1024), 1);
  placement_counts_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      tid.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), nw.data_ptr<bool>(),
      sz.data_ptr<int64_t>(), n, num_tables,
      reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace dynamicemb
