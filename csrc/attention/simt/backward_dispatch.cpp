#include "attention/simt/backward_launch.h"
#include "attention/simt/forward_config.h"
#include "common/check.h"

namespace samattn::simt {
namespace {

template <DType kDType>
void run_backward(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  // D is only read for rows that see a key.
  if (params.fwd.kept_keys > 0 && params.fwd.seqlen_q > 0) {
    launch_backward_preprocess<kDType>(params, stream);
  }
  const int width =
      params.fwd.head_dim > params.fwd.head_dim_v ? params.fwd.head_dim : params.fwd.head_dim_v;
  switch (head_dim_bucket(width)) {
    case 32:
      return launch_backward<kDType, 32>(params, stream);
    case 64:
      return launch_backward<kDType, 64>(params, stream);
    case 128:
      return launch_backward<kDType, 128>(params, stream);
    case 256:
      return launch_backward<kDType, 256>(params, stream);
  }
  SAMATTN_CHECK(false, "head_dim ", width, " is not supported by the SIMT backward (1..256)");
}

}  // namespace

void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat64:
      return run_backward<DType::kFloat64>(params, stream);
    case DType::kFloat32:
      return run_backward<DType::kFloat32>(params, stream);
    case DType::kFloat16:
      return run_backward<DType::kFloat16>(params, stream);
    case DType::kBFloat16:
      return run_backward<DType::kBFloat16>(params, stream);
  }
  SAMATTN_CHECK(false, "dtype ", dtype_name(dtype), " is not supported by the SIMT backward");
}

}  // namespace samattn::simt
