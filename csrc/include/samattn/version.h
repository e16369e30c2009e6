#pragma once

#define SAMATTN_VERSION_MAJOR 0
#define SAMATTN_VERSION_MINOR 1
#define SAMATTN_VERSION_PATCH 0

namespace samattn {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace samattn
