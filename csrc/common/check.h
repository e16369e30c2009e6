// Internal: argument checks that build an error message naming the argument.
//
// Messages are assembled with std::to_string and snprintf, never with iostreams: a toolchain that
// links parts of libstdc++ statically into a shared library (seen with the GPU machine's g++ 13
// building samattn._C) can leave those stream instantiations broken once the library is loaded
// into a process that already holds another libstdc++, and the first formatted error crashed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "samattn/error.h"

namespace samattn::detail {

inline void append(std::string& out, std::string_view text) { out += text; }
inline void append(std::string& out, const char* text) { out += text; }
inline void append(std::string& out, char c) { out += c; }
inline void append(std::string& out, bool value) { out += value ? "true" : "false"; }

inline void append(std::string& out, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.10g", value);
  out += buffer;
}

inline void append(std::string& out, const void* pointer) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%p", pointer);
  out += buffer;
}

template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
void append(std::string& out, T value) {
  out += std::to_string(value);
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}

}  // namespace samattn::detail

// SAMATTN_CHECK(cond, "argument", " must be ...", value) throws Error("samattn: argument must be
// ...") when cond is false.
#define SAMATTN_CHECK(cond, ...)                                                   \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      throw ::samattn::Error(::samattn::detail::concat("samattn: ", __VA_ARGS__)); \
    }                                                                              \
  } while (0)
