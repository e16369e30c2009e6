// Internal: how many threads one call of the fp64 reference runs on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>

namespace samattn::detail {

// The multiply-adds a further thread must get to pay for itself. Starting and joining a
// std::thread took ~45 µs on this project's 2-core CI machine (stop 49: a (1, 2, 4, 8) call with
// two threads 52 µs, (1, 1, 1, 8) on one 6 µs), the time of a few tens of thousands of the
// reference's multiply-adds; a million keeps that cost under a few percent, and small calls (the
// tests', the torch ops' CPU path) on the calling thread.
inline constexpr int64_t kReferenceMultiplyAddsPerThread = int64_t{1} << 20;

// Threads for `slices` independent slices holding `multiply_adds` in all: one per slice, up to the
// machine's hardware threads and 64, and no more than the work pays for. Each slice is computed
// by one thread whatever the count, so the results do not depend on it.
inline int64_t reference_workers(int64_t slices, int64_t multiply_adds) {
  const int64_t affordable = 1 + multiply_adds / kReferenceMultiplyAddsPerThread;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::clamp<int64_t>(std::min(hardware, affordable), 1, std::min<int64_t>(slices, 64));
}

}  // namespace samattn::detail
