/**
 * @file check.h
 * @brief Input checks that raise torch's typed errors (ValueError, TypeError, IndexError) with no
 *        C++ backtrace attached.
 *
 * Why not TORCH_CHECK: its error constructor (the SourceLocation one) captures a C++ backtrace at
 * the throw. On the GPU machine (torch 2.11.0+cu130, this extension built by g++ 13.3) every failed
 * TORCH_CHECK raised from this library's frames, in a CPU or a CUDA kernel alike, killed the
 * process with a segfault, while a std::runtime_error thrown from the same place was caught. The
 * base constructor takes the backtrace as an argument: passing none skips the capture. The Python
 * error type and message are the same as TORCH_CHECK's.
 */
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#define DEMB_CHECK_WITH(error_t, cond, ...)                             \
  do {                                                                  \
    if (C10_UNLIKELY(!(cond))) {                                        \
      throw ::c10::error_t(::c10::str(__VA_ARGS__), /*backtrace=*/nullptr); \
    }                                                                   \
  } while (0)

#define DEMB_CHECK(cond, ...) DEMB_CHECK_WITH(Error, cond, __VA_ARGS__)
#define DEMB_CHECK_VALUE(cond, ...) DEMB_CHECK_WITH(ValueError, cond, __VA_ARGS__)
#define DEMB_CHECK_TYPE(cond, ...) DEMB_CHECK_WITH(TypeError, cond, __VA_ARGS__)
#define DEMB_CHECK_INDEX(cond, ...) DEMB_CHECK_WITH(IndexError, cond, __VA_ARGS__)
