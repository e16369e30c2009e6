// The fp32 SGEMM tile configurations bench_gemm --sgemm-variants measures against cuBLAS, each
// its own instantiation of the library's kernel (the library ships one of them: ShippedSgemm
// in csrc/gemm/simt/sgemm_args.h). Benchmark-only: not part of the library build.
#include "sgemm_variants.h"

#include "gemm/simt/sgemm_launch.cuh"

namespace {

using namespace samattn::detail::simt;

template <typename Cfg>
void run(const samattn::GemmParams& params, cudaStream_t stream) {
  launch_sgemm<Cfg>(params, stream);
}

}  // namespace

const SgemmVariant kSgemmVariants[] = {
    {"128x256x8_w64x64_t8x16", &run<Sgemm128x256x8>},
    {"128x256x8_w64x64_t8x16_pf", &run<Sgemm128x256x8Pf>},
    {"128x256x16_w64x64_t8x16_pf", &run<Sgemm128x256x16Pf>},
    {"128x256x16_w64x32_t8x8", &run<Sgemm128x256x16Warps16>},
    {"256x128x8_w64x64_t8x16_pf", &run<Sgemm256x128x8Pf>},
    {"128x256x8_w64x64_t8x16_pf_split", &run<Sgemm128x256x8PfSplit>},
    {"128x256x8_w64x64_t8x16_pf_split_store5", &run<Sgemm128x256x8PfSplitStore5>},
    {"128x256x8_w64x64_t8x16_pf_split_store3", &run<Sgemm128x256x8PfSplitStore3>},
    {"128x256x16_w64x64_t8x16_pf_split", &run<Sgemm128x256x16PfSplit>},
    {"256x128x8_w64x64_t8x16_pf_split", &run<Sgemm256x128x8PfSplit>},
    {"128x128x8_w64x64_t8x16_pf", &run<Sgemm128x128x8Lane8x16Pf>},
    {"128x128x8_w64x32_t8x8", &run<Sgemm128x128x8>},
    {"128x256x8_w64x64_t8x16_s4", &run<Sgemm128x256x8Stages4>},
    {"128x256x16_w64x64_t8x16_s3", &run<Sgemm128x256x16Stages3>},
    {"128x128x8_w64x32_t8x8_s4", &run<Sgemm128x128x8Stages4>},
    {"128x128x16_w64x32_t8x8_s3", &run<Sgemm128x128x16Stages3>},
    {"128x128x8_w64x64_t8x16_s4", &run<Sgemm128x128x8Lane8x16Stages4>},
};
const int kSgemmVariantCount = sizeof(kSgemmVariants) / sizeof(kSgemmVariants[0]);
