/**
 * @file hashing.h
 * @brief The one definition of a key's hash, home bucket and digest (docs/table_design.md).
 *
 * Mirrored in Python by dynamicemb_core/table/hashing.py; tests/table/test_hashing.py checks that
 * both give the same answers for edge keys (INT64_MIN, -1, 0, INT64_MAX) and random ones.
 */
#pragma once

#include <cstdint>

#include "dynamicemb/host_device.h"

namespace dynamicemb {

/**
 * @brief MurmurHash3's 64-bit finalizer (fmix64): a bijection on uint64 with full avalanche.
 *
 * Constants from Austin Appleby's MurmurHash3.cpp (public domain), the function named fmix64.
 */
DEMB_HOST_DEVICE uint64_t murmur3_fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

/** @brief Hash of an int64 key: fmix64 of its two's-complement bits. */
DEMB_HOST_DEVICE uint64_t hash_key(int64_t key) {
  return murmur3_fmix64(static_cast<uint64_t>(key));
}

/** @brief Home bucket of a hash in a table of num_buckets (> 0) buckets: the only bucket it may use. */
DEMB_HOST_DEVICE int64_t bucket_of(uint64_t h, int64_t num_buckets) {
  return static_cast<int64_t>(h % static_cast<uint64_t>(num_buckets));
}

/**
 * @brief One-byte digest in 1..255 (0 marks an empty slot), from the hash's top byte.
 *
 * A probe compares digests first and the full key only on a digest match, so a bucket scan
 * mostly touches the digest array (about 1/255 false matches).
 */
DEMB_HOST_DEVICE uint8_t digest_of(uint64_t h) {
  return static_cast<uint8_t>(1 + ((h >> 56) % 255));
}

}  // namespace dynamicemb
