"""One attention call inside cudaProfilerStart/Stop, for `ncu --profile-from-start off`
(scripts/dev/ncu-backward, scripts/dev/ab-bwd, scripts/dev/ncu-forward-l2): three warm-up calls
outside the profiled range, then one inside it. The backward's forward runs outside the range.
bf16, (B, H, S, D) from the arguments, causal or not; with --kv-stride N (forward), ours runs
kv_stride=N and cuDNN the `k[:, :, ::N]` views.

    python benchmarks/profile_attention_call.py {ours,cudnn} [--direction {fwd,bwd}]
                                                [--batch B] [--heads H] [--seqlen S]
                                                [--head-dim D] [--causal] [--kv-stride N]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", choices=["ours", "cudnn"],
                        help="ours: samattn.attention; cudnn: SDPA's cuDNN backend")
    parser.add_argument("--direction", choices=["fwd", "bwd"], default="bwd",
                        help="the profiled call: the forward or the backward (default)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--kv-stride", type=int, default=1,
                        help="ours: kv_stride; cuDNN: every N-th key and value row (forward)")
    args = parser.parse_args()
    if args.kv_stride > 1 and (args.direction == "bwd" or args.causal):
        parser.error("--kv-stride compares the two only for the non-causal forward")
    shape = (args.batch, args.heads, args.seqlen, args.head_dim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    backward = args.direction == "bwd"
    for t in (q, k, v):
        t.requires_grad_(backward)

    def forward():
        stride = args.kv_stride
        if args.impl == "ours":
            return samattn.attention(q, k, v, causal=args.causal, kv_stride=stride)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k[:, :, ::stride], v[:, :, ::stride],
                                                  is_causal=args.causal)

    out = forward() if backward else None

    def call():
        if backward:
            out.backward(dout, retain_graph=True)
        else:
            forward()

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
