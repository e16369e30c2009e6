#include "attention/simt/forward_config.h"
#include "attention/simt/forward_launch.h"
#include "common/check.h"

namespace samattn::simt {
namespace {

template <DType kDType>
void dispatch_bucket(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  const int width = params.head_dim > params.head_dim_v ? params.head_dim : params.head_dim_v;
  switch (head_dim_bucket(width)) {
    case 32: return launch_forward<kDType, 32>(params, stream);
    case 64: return launch_forward<kDType, 64>(params, stream);
    case 128: return launch_forward<kDType, 128>(params, stream);
    case 256: return launch_forward<kDType, 256>(params, stream);
  }
  SAMATTN_CHECK(false, "head_dim ", width, " is not supported by the SIMT kernel (1..256)");
}

}  // namespace

void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params,
                      cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat64: return dispatch_bucket<DType::kFloat64>(params, stream);
    case DType::kFloat32: return dispatch_bucket<DType::kFloat32>(params, stream);
    case DType::kFloat16: return dispatch_bucket<DType::kFloat16>(params, stream);
    case DType::kBFloat16: return dispatch_bucket<DType::kBFloat16>(params, stream);
  }
  SAMATTN_CHECK(false, "dtype ", dtype_name(dtype), " is not supported by the SIMT kernel");
}

}  // namespace samattn::simt
