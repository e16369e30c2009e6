#include "attention/alignment.h"

#include "common/check.h"

namespace samattn::detail {

std::string misalignment(const char* name, const void* pointer, const Strides& strides,
                         int64_t row_stride, int64_t batch, int64_t heads, int64_t rows,
                         int element_bytes, StrideRule rule) {
  constexpr int64_t kAlign = 16;
  constexpr int64_t kMaxTmaStrideBytes = int64_t{1} << 40;
  if (reinterpret_cast<uintptr_t>(pointer) % kAlign != 0) {
    return concat(name, " pointer ", pointer, " is not 16-byte aligned");
  }
  const struct {
    const char* what;
    int64_t stride, extent;
  } steps[] = {
      {"batch", strides.batch, batch}, {"head", strides.head, heads}, {"row", row_stride, rows}};
  for (const auto& step : steps) {
    if (step.extent <= 1) continue;
    const int64_t bytes = step.stride * element_bytes;
    if (rule == StrideRule::kTma &&
        (bytes % kAlign != 0 || bytes <= 0 || bytes >= kMaxTmaStrideBytes)) {
      return concat(name, " ", step.what, " stride ", step.stride,
                    " elements (TMA needs a positive multiple of 16 bytes below 2^40)");
    }
    if (bytes % kAlign != 0) {
      return concat(name, " ", step.what, " stride ", step.stride,
                    " elements is not a multiple of 16 bytes");
    }
  }
  return "";
}

}  // namespace samattn::detail
