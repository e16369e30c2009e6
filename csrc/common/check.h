// Internal: argument checks that build an error message naming the argument.
#pragma once

#include <sstream>
#include <string>

#include "samattn/error.h"

namespace samattn::detail {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream stream;
  (stream << ... << parts);
  return stream.str();
}

}  // namespace samattn::detail

// SAMATTN_CHECK(cond, "argument", " must be ...", value) throws Error("samattn: argument must be
// ...") when cond is false.
#define SAMATTN_CHECK(cond, ...)                                                      \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      throw ::samattn::Error(::samattn::detail::concat("samattn: ", __VA_ARGS__));     \
    }                                                                                 \
  } while (0)
