// Internal: what the operators' autograd kernels (autograd.cpp, gemm_autograd.cpp) share.
#pragma once

#include <initializer_list>
#include <mutex>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

namespace samattn::torch_ops {

// The operator `name` (no overload) with its C++ signature, to call through the dispatcher:
// `op().call(...)`. Looked up on first use (after the TORCH_LIBRARY blocks have registered it),
// then kept.
template <typename Signature>
class OperatorHandle {
 public:
  explicit OperatorHandle(const char* name) : name_(name) {}
  const c10::TypedOperatorHandle<Signature>& operator()() const {
    std::call_once(found_, [this] {
      handle_.emplace(
          c10::Dispatcher::singleton().findSchemaOrThrow(name_, "").template typed<Signature>());
    });
    return *handle_;
  }

 private:
  const char* name_;
  mutable std::once_flag found_;
  mutable std::optional<c10::TypedOperatorHandle<Signature>> handle_;
};

// True when autograd would record this call: grad mode on and a tensor argument requiring grad.
inline bool records_graph(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// For the operators that write into a caller's tensor (gemm_out, attention_forward_into), which
// have no backward: raises, naming `op` and `instead`, when autograd would record the call (torch's
// fallback for an operator without an autograd kernel would let the gradient silently go missing).
inline void refuse_gradients(std::initializer_list<const at::Tensor*> tensors, const char* op,
                             const char* instead) {
  TORCH_CHECK(!records_graph(tensors), "samattn: ", op,
              " writes into its output and is not differentiable; for gradients call ", instead);
}

}  // namespace samattn::torch_ops
