/**
 * @file score_policy.h
 * @brief Score policy codes, how a touch updates a slot's score words, and which slot a full bucket
 * gives up (docs/table_design.md, "Policy codes and score words").
 *
 * Every slot has two int64 score words in internal order: word 0 is the eviction score (timestamp,
 * step, custom score or access count), word 1 is the timestamp for COMPOUND and 0 otherwise.
 */
#pragma once

#include <cstdint>

#include "dynamicemb/host_device.h"

namespace dynamicemb {

/** @brief Policy codes stored in the (T,) `policies` tensor; DynamicEmbScoreStrategy values + COMPOUND. */
enum ScorePolicy : int64_t {
  kTimestamp = 0,   ///< word0 = time of the last touch
  kStep = 1,        ///< word0 = the table's step at the last touch
  kCustomized = 2,  ///< word0 = the user's score at the last touch
  kLfu = 3,         ///< word0 = access count
  kNoEviction = 4,  ///< word0 = the key's insertion number (set once); a full bucket refuses new keys
  kCompound = 5,    ///< word0 = access count, word1 = time of the last touch
  kNumPolicies = 6,
};

/**
 * @brief Compiled compound score function: `scores` are the slot's two words in internal order
 * ([count, timestamp]); dynamicemb_core/table/score_function.py adapts the user's function, which
 * sees its own tuple order. Lower result = evicted first; NaN = evicted before everything.
 */
using ScoreFn = double (*)(const int64_t* scores, int64_t now);

/** @brief True for a valid policy code. */
DEMB_HOST_DEVICE bool is_valid_policy(int64_t policy) {
  return policy >= 0 && policy < kNumPolicies;
}

/** @brief True when the policy's time word reads `now` (a clock when cur_score < 0). */
DEMB_HOST_DEVICE bool policy_uses_clock(int64_t policy) {
  return policy == kTimestamp || policy == kCompound;
}

/**
 * @brief True when a touch leaves the slot's words as they are: NO_EVICTION scores a key by its
 * insertion number, which the Python class writes once after the key is placed (a new key keeps
 * {0, 0} until then), as the seed's NO_EVICTION thresholds on that absolute score.
 */
DEMB_HOST_DEVICE bool policy_keeps_words(int64_t policy) { return policy == kNoEviction; }

/** @brief True when a full bucket may evict a slot for a new key. */
DEMB_HOST_DEVICE bool policy_can_evict(int64_t policy) { return policy != kNoEviction; }

/**
 * @brief The call's score for a table: `cur_score` itself, or the clock when the policy is
 * time-based and `cur_score` < 0 (the caller reads the clock once per call and passes it in).
 */
DEMB_HOST_DEVICE int64_t resolve_now(int64_t policy, int64_t cur_score, int64_t clock_ns) {
  return (policy_uses_clock(policy) && cur_score < 0) ? clock_ns : cur_score;
}

/**
 * @brief How many accesses a touch of occurrence i counts: `counts[i]` where the caller gives
 * per-key counts (a lookup that deduplicated its keys passes each unique key's occurrences in the
 * batch, so an LFU count grows by every occurrence as NVIDIA's DynamicEmb counts them), else 1
 * (each occurrence of a key in the call is its own touch). 0: the touch places or keeps the key
 * without counting an access (a prefetch, whose forward counts the batch's accesses).
 */
DEMB_HOST_DEVICE int64_t touch_count(const int64_t* counts, int64_t i) {
  return counts != nullptr ? counts[i] : 1;
}

/**
 * @brief Apply one touch (occurrence i of a key in a call, counting `count` accesses, see
 * touch_count) to a slot's score words.
 *
 * A new key starts from words {0, 0}, so the touches of one call leave an LFU count equal to the
 * accesses they count, and an existing key's count grows by that number.
 * @param words  the slot's two words, internal order, updated in place.
 * @param now    resolve_now(...) for the key's table.
 * @param count  accesses this touch counts (LFU and COMPOUND add it; other policies ignore it).
 */
DEMB_HOST_DEVICE void apply_touch(int64_t policy, int64_t now, int64_t* words, int64_t count = 1) {
  if (policy_keeps_words(policy)) return;
  switch (policy) {
    case kLfu:
      words[0] += count;
      words[1] = 0;
      break;
    case kCompound:
      words[0] += count;
      words[1] = now;
      break;
    default:  // TIMESTAMP, STEP, CUSTOMIZED
      words[0] = now;
      words[1] = 0;
      break;
  }
}

/**
 * @brief Eviction rank of a slot without a score function: compare (word0, word1) for COMPOUND
 * (count, then older timestamp first), word0 alone otherwise. Returns true when a ranks below b.
 */
DEMB_HOST_DEVICE bool ranks_below(int64_t policy, const int64_t* a, const int64_t* b) {
  if (policy == kCompound) {
    return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]);
  }
  return a[0] < b[0];
}

/** @brief Order of two score-function results: NaN below every number, then ascending. */
DEMB_HOST_DEVICE bool fn_ranks_below(double a, double b) {
  const bool a_nan = a != a;
  const bool b_nan = b != b;
  if (a_nan || b_nan) return a_nan && !b_nan;
  return a < b;
}

}  // namespace dynamicemb
