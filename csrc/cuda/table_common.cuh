/**
 * @file table_common.cuh
 * @brief Device helpers shared by the CUDA table kernels (csrc/cuda/table.cu): the clock, a key's
 * home bucket, digest probes and score-word access.
 *
 * The rules themselves (hash, bucket, digest, how a touch changes the score words, victim order)
 * come from csrc/include/dynamicemb/ so that the CPU and CUDA kernels cannot drift apart; this file
 * only adds what is specific to running them on a GPU.
 */
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "dynamicemb/bucket_layout.h"
#include "dynamicemb/hashing.h"
#include "dynamicemb/score_policy.h"
#include "dynamicemb/check.h"
#include "dynamicemb/table_checks.h"

namespace dynamicemb {
namespace cuda_table {

constexpr int kBlockThreads = 256;  // every table kernel uses 256-thread blocks

/** @brief Blocks needed for `work` items at `per_block` items per block (at least 1). */
inline int64_t blocks_for(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b > 0 ? b : 1;
}

/** @brief The device's nanosecond clock (%globaltimer), the CUDA side of "read the clock". */
__device__ __forceinline__ int64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}

/**
 * @brief One thread reads the clock once and resolves every table's score for the call, so all
 * keys of one call see the same time (the CPU kernels read steady_clock once per call too).
 */
__global__ void resolve_now_kernel(const int64_t* __restrict__ policies,
                                   const int64_t* __restrict__ cur_scores, int64_t num_tables,
                                   int64_t* __restrict__ now) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int64_t clock = global_timer_ns();
  for (int64_t t = 0; t < num_tables; ++t) now[t] = resolve_now(policies[t], cur_scores[t], clock);
}

/** @brief (T,) int64 on the device: each table's score for this call (see score_policy.h). */
inline at::Tensor resolve_now_cuda(const at::Tensor& policies, const at::Tensor& cur_scores) {
  const int64_t num_tables = policies.size(0);
  at::Tensor now = at::empty({num_tables}, policies.options());
  if (num_tables == 0) return now;
  resolve_now_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(
      policies.data_ptr<int64_t>(), cur_scores.data_ptr<int64_t>(), num_tables,
      now.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return now;
}

/** @brief Where a key may live: its table's layout, its bucket's global slot range and its digest. */
struct KeyHome {
  TableLayout layout;
  int64_t begin;   ///< first global slot of the key's bucket
  int64_t end;     ///< one past its last global slot
  uint8_t digest;  ///< the key's digest, 1..255
};

/**
 * @brief Home of `key` in table `t`; false when `t` is out of range or the table has no bucket
 * (such a key is reported missing / not placed instead of touching memory it does not own).
 */
__device__ __forceinline__ bool key_home(int64_t key, int64_t t, int64_t num_tables,
                                         const int64_t* slot_offsets, const int64_t* bucket_caps,
                                         KeyHome* home) {
  if (t < 0 || t >= num_tables) return false;
  home->layout = table_layout(slot_offsets, bucket_caps, t);
  if (home->layout.num_buckets <= 0) return false;
  const uint64_t h = hash_key(key);
  home->begin = bucket_begin(home->layout, bucket_of(h, home->layout.num_buckets));
  home->end = home->begin + home->layout.bucket_cap;
  home->digest = digest_of(h);
  return true;
}

/** @brief Bit b (0..3) set where byte b of `w` equals `d` (d != 0). */
__device__ __forceinline__ uint32_t byte_matches(uint32_t w, uint8_t d) {
  const uint32_t eq = __vcmpeq4(w, 0x01010101u * d);  // 0xff in each equal byte
  return ((eq >> 7) & 1u) | ((eq >> 14) & 2u) | ((eq >> 21) & 4u) | ((eq >> 28) & 8u);
}

/** @brief What one probe of a bucket found: the key's global slot and the lowest empty slot. */
struct Probe {
  int64_t hit;    ///< global slot holding the key, or -1
  int64_t empty;  ///< lowest empty global slot (only when asked for and the key is absent), or -1
  int64_t w0, w1;  ///< the hit's score words, with tile_probe's `scores` (else 0)
};

/**
 * @brief Bits k (0..15) of the 16 digests at global slot g: `*match` where the digest equals d,
 * `*empty` where it is 0. One 16-byte load when aligned and inside [g, end); bytes one by one
 * otherwise (only a single-bucket table whose region is not 16-aligned gets there).
 */
template <bool kCoherent = false>
__device__ __forceinline__ void scan16(const uint8_t* digests, int64_t g, int64_t end, uint8_t d,
                                       uint32_t* match, uint32_t* empty) {
  const uint8_t* p = digests + g;
  uint32_t m = 0, e = 0;
  if (g + 16 <= end && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 v = kCoherent ? __ldcg(reinterpret_cast<const uint4*>(p))
                              : *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      m |= byte_matches(w[q], d) << (4 * q);
      e |= byte_matches(w[q] ^ 0x01010101u, 1) << (4 * q);  // bytes equal to 0
    }
  } else {
    for (int k = 0; k < 16 && g + k < end; ++k) {
      const uint8_t b =
          kCoherent ? static_cast<uint8_t>(__ldcg(reinterpret_cast<const unsigned char*>(p + k)))
                    : p[k];
      m |= static_cast<uint32_t>(b == d) << k;
      e |= static_cast<uint32_t>(b == 0) << k;
    }
  }
  *match = m;
  *empty = e;
}

/**
 * @brief Probe [home.begin, home.end) for `key` with a tile of threads (cooperative groups), each
 * reading kVec x 16 digests per step with independent 16-byte loads, so a tile of 4 with kVec 2
 * covers a 128-slot bucket in one step. Full keys are compared only where the digest matches
 * (~1/255 false matches). With `want_empty` the same reads also give the lowest empty slot.
 * Every thread of the tile gets the answer. `kCoherent` reads through L2 (__ldcg): for probes
 * under a bucket lock, which must see what other SMs wrote in the same kernel. With `scores`
 * (lookups that report words), a digest match loads the slot's words together with its key, so
 * the words cost no round trip of their own; only a false digest match (~1/255) wastes the load.
 */
template <int kVec, typename Tile, bool kCoherent = false>
__device__ __forceinline__ Probe tile_probe(const Tile& tile, const int64_t* table_keys,
                                            const uint8_t* digests, int64_t key,
                                            const KeyHome& home, bool want_empty,
                                            const int64_t* scores = nullptr) {
  const int rank = tile.thread_rank();
  const int64_t stride = 16 * kVec * static_cast<int64_t>(tile.size());
  Probe r{-1, -1, 0, 0};
  for (int64_t base = home.begin; base < home.end; base += stride) {
    const int64_t g0 = base + 16 * kVec * rank;
    uint32_t m[kVec], e[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      m[v] = e[v] = 0;
      if (g0 + 16 * v < home.end) {
        scan16<kCoherent>(digests, g0 + 16 * v, home.end, home.digest, &m[v], &e[v]);
      }
    }
    int64_t hit = -1, empty = -1;
    longlong2 words = make_longlong2(0, 0);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      while (m[v] && hit < 0) {
        const int b = __ffs(m[v]) - 1;
        m[v] &= m[v] - 1;
        const int64_t g = g0 + 16 * v + b;
        const int64_t* kp = table_keys + g;
        if (scores != nullptr) words = *reinterpret_cast<const longlong2*>(scores + 2 * g);
        if ((kCoherent ? __ldcg(kp) : *kp) == key) hit = g;
      }
      if (e[v] && empty < 0) empty = g0 + 16 * v + __ffs(e[v]) - 1;
    }
    const unsigned hits = tile.ballot(hit >= 0);
    if (hits) {
      const int src = __ffs(hits) - 1;
      return Probe{tile.shfl(hit, src), -1, tile.shfl(words.x, src), tile.shfl(words.y, src)};
    }
    if (want_empty && r.empty < 0) {
      const unsigned empties = tile.ballot(empty >= 0);
      if (empties) r.empty = tile.shfl(empty, __ffs(empties) - 1);
    }
  }
  return r;
}

/** @brief The two score words of a global slot, internal order. */
__device__ __forceinline__ void load_words(const int64_t* scores, int64_t g, int64_t* w) {
  const longlong2 v = *reinterpret_cast<const longlong2*>(scores + 2 * g);
  w[0] = v.x;
  w[1] = v.y;
}

/** @brief load_words through L2, for reads under a bucket lock (see tile_probe's kCoherent). */
__device__ __forceinline__ void load_words_cg(const int64_t* scores, int64_t g, int64_t* w) {
  const longlong2 v = __ldcg(reinterpret_cast<const longlong2*>(scores + 2 * g));
  w[0] = v.x;
  w[1] = v.y;
}

__device__ __forceinline__ void store_words(int64_t* scores, int64_t g, const int64_t* w) {
  *reinterpret_cast<longlong2*>(scores + 2 * g) = make_longlong2(w[0], w[1]);
}

/** @brief Marks a global slot as written by this call (protected from eviction). */
__device__ __forceinline__ void protect(uint32_t* bits, int64_t g) {
  atomicOr(bits + (g >> 5), 1u << (g & 31));
}

/** @brief Reads through L2 (__ldcg): the bits are set with atomics, which bypass L1. */
__device__ __forceinline__ bool is_protected(const uint32_t* bits, int64_t g) {
  return (__ldcg(bits + (g >> 5)) >> (g & 31)) & 1u;
}

/**
 * @brief Records the smallest i with x[i] outside [lo, hi) as the maximum of ~i in *word, so that
 *        a zeroed word (one memset) means "none".
 */
__global__ void first_outside_kernel(const int64_t* __restrict__ x, int64_t n, int64_t lo,
                                     int64_t hi, unsigned long long* __restrict__ word) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (x[i] < lo || x[i] >= hi) atomicMax(word, ~static_cast<unsigned long long>(i));
  }
}

/**
 * @brief Index of the first x[i] outside [lo, hi), or -1: the data check of table_checks.h run
 *        where the data lives. A memset, one kernel and an 8-byte copy into pinned memory: the one
 *        device synchronisation it costs is paid so that a bad id raises before anything is
 *        written, as on CPU.
 */
inline int64_t first_outside(const at::Tensor& x, int64_t lo, int64_t hi, cudaStream_t stream) {
  const int64_t n = x.numel();
  if (n == 0) return -1;
  at::Tensor word = at::empty({1}, x.options().dtype(at::kLong));
  at::Tensor host = at::empty({1}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* w = reinterpret_cast<unsigned long long*>(word.data_ptr<int64_t>());
  C10_CUDA_CHECK(cudaMemsetAsync(w, 0, sizeof(*w), stream));
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1024));
  first_outside_kernel<<<blocks, 256, 0, stream>>>(x.data_ptr<int64_t>(), n, lo, hi, w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  C10_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr<int64_t>(), w, sizeof(*w), cudaMemcpyDeviceToHost,
                                 stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto found = static_cast<unsigned long long>(*host.data_ptr<int64_t>());
  return found == 0 ? -1 : static_cast<int64_t>(~found);
}

}  // namespace cuda_table
}  // namespace dynamicemb
