// Errors raised by samattn: one exception type whose message names the offending argument.
#pragma once

#include <stdexcept>
#include <string>

namespace samattn {

// Thrown for invalid arguments, unsupported configurations and CUDA failures.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Result of a `can_implement` query: ok() or the message `attention_forward` would throw.
class Status {
 public:
  static Status success() { return Status(""); }
  static Status failure(std::string message) { return Status(std::move(message)); }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::string message_;
};

}  // namespace samattn
