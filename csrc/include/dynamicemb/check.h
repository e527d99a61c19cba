/**
 * @file check.h
 * @brief Input checks that raise torch's typed errors (ValueError, TypeError, IndexError) with no
 *        C++ backtrace attached.
 *
 * Why not TORCH_CHECK: on the GPU machine (torch 2.11.0+cu130, g++ 13.3), an extension built there
 * links libstdc++ statically (its .so needs no libstdc++.so.6 and exports __cxa_throw), and the
 * first std::ostringstream constructed inside it segfaults (most likely the static copy's iostream
 * and locale state is never initialised). TORCH_CHECK formats its message with c10::str, an inline ostringstream, so
 * every failed check crashed the process. A probe op there showed it: std::ostringstream alone
 * crashed, throwing c10::ValueError with a ready string was caught as ValueError. So the messages
 * here are built by plain string appends, and this library uses no iostreams at all. The Python
 * error type and message are TORCH_CHECK's.
 */
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <string>
#include <type_traits>

namespace dynamicemb {
namespace check_detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
inline void append(std::string& s, bool v) { s += v ? "true" : "false"; }
inline void append(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }
inline void append(std::string& s, c10::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}
template <typename T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool> &&
                                           !std::is_same_v<T, char>,
                                       int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename T, std::enable_if_t<std::is_enum_v<T>, int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(static_cast<long long>(v));
}

/// The message of a failed check: its parts appended in order.
template <typename... Args>
std::string message(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

}  // namespace check_detail
}  // namespace dynamicemb

#define DEMB_CHECK_WITH(error_t, cond, ...)                             \
  do {                                                                  \
    if (C10_UNLIKELY(!(cond))) {                                        \
      throw ::c10::error_t(::dynamicemb::check_detail::message(__VA_ARGS__), nullptr); \
    }                                                                   \
  } while (0)

#define DEMB_CHECK(cond, ...) DEMB_CHECK_WITH(Error, cond, __VA_ARGS__)
#define DEMB_CHECK_VALUE(cond, ...) DEMB_CHECK_WITH(ValueError, cond, __VA_ARGS__)
#define DEMB_CHECK_TYPE(cond, ...) DEMB_CHECK_WITH(TypeError, cond, __VA_ARGS__)
#define DEMB_CHECK_INDEX(cond, ...) DEMB_CHECK_WITH(IndexError, cond, __VA_ARGS__)
