// Helpers shared by the shim's translation units: turning C++ exceptions into C error strings.
#pragma once
#include <c10/util/Exception.h>
#include <cstdlib>
#include <cstring>
#include <string>
#include "shim.h"

namespace gmt {
inline char* dup_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}
}  // namespace gmt

// Runs the body; returns NULL on success or the exception's message.
#define GMT_TRY(...)                                                  \
  try {                                                               \
    __VA_ARGS__;                                                      \
    return nullptr;                                                   \
  } catch (const c10::Error& e) {                                     \
    return gmt::dup_string(e.what_without_backtrace());               \
  } catch (const std::exception& e) {                                 \
    return gmt::dup_string(e.what());                                 \
  } catch (...) {                                                     \
    return gmt::dup_string("unknown C++ exception");                  \
  }
