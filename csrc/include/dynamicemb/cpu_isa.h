/**
 * @file cpu_isa.h
 * @brief CPU only: one row loop, compiled twice (AVX2 and the build's baseline), chosen at run time.
 *
 * The extension is built without ``-march`` (it must load on any x86-64 host), so by default the
 * compiler vectorises the row loops four floats wide. A hot loop written once as an always-inline
 * template is instantiated both in a function compiled with ``target("avx2")`` and in a plain one;
 * ``cpu_has_avx2()`` picks the first where the CPU has AVX2. FMA stays off in both clones
 * (``target("avx2")`` does not enable it), so every product and sum rounds on its own, as in the
 * baseline build and in the CUDA kernels (grouped.h): both clones give the same bits.
 *
 * Elsewhere (not x86-64, or not GCC/Clang) only the plain function exists. The environment variable
 * ``DYNAMICEMB_CPU_ISA=baseline`` (read once per process) makes an AVX2 CPU run the plain clones
 * too: the tests compare both clones' bits that way.
 */
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DEMB_CPU_AVX2 1
#define DEMB_TARGET_AVX2 __attribute__((target("avx2")))
#endif

// DEMB_LAMBDA_INLINE, after a lambda's parameter list: a lambda handed to a cloned loop is
// inlined into each clone (so it runs with that clone's instructions, not the baseline's).
#if defined(__GNUC__) || defined(__clang__)
#define DEMB_ALWAYS_INLINE inline __attribute__((always_inline))
#define DEMB_LAMBDA_INLINE __attribute__((always_inline))
#else
#define DEMB_ALWAYS_INLINE inline
#define DEMB_LAMBDA_INLINE
#endif

namespace dynamicemb {

/// Whether this CPU runs the AVX2 clones (asked once).
inline bool cpu_has_avx2() {
#ifdef DEMB_CPU_AVX2
  static const bool has = [] {
    const char* isa = std::getenv("DYNAMICEMB_CPU_ISA");
    if (isa != nullptr && std::strcmp(isa, "baseline") == 0) return false;
    return static_cast<bool>(__builtin_cpu_supports("avx2"));
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace dynamicemb
