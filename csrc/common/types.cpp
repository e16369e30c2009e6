#include "samattn/types.h"

#include "samattn/attention.h"
#include "common/check.h"

namespace samattn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return 8;
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
  }
  SAMATTN_CHECK(false, "dtype ", static_cast<int>(dtype),
                " is not one of float64, float32, float16, bfloat16");
  return 0;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kSimt: return "simt";
    case Backend::kTensorCore: return "tensor_core";
    case Backend::kHopper: return "hopper";
  }
  return "unknown";
}

}  // namespace samattn
