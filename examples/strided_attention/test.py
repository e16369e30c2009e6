"""Seed 000's test driver, running on samattn.

  python test.py --mode=correctness   # fp64, samattn vs the naive loop, several shapes
  python test.py --mode=benchmark     # fp32, B=16, S=1024, E=512, H=8, stride 4
"""

import argparse
import datetime
import json
import math
import os
import sys

import torch

import samattn
from attention import CustomStridedAttention, NaiveStridedAttention, naive_strided_attention
from model import SimpleModel

# (batch, heads, seq_len, head_dim, stride): the assignment's shapes plus odd ones.
CORRECTNESS_SHAPES = [
    (2, 4, 64, 16, 2),
    (1, 3, 77, 40, 3),
    (3, 2, 129, 64, 4),
    (2, 8, 1000, 72, 5),
    (1, 1, 1, 8, 1),
    (2, 2, 33, 256, 7),
]


def check_correctness(device):
    torch.manual_seed(0)
    ok = True
    for batch, heads, seq_len, head_dim, stride in CORRECTNESS_SHAPES:
        q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=torch.float64,
                               device=device) for _ in range(3))
        expected = naive_strided_attention(q, k, v, stride)
        got = samattn.strided_attention(q, k, v, stride)
        passed = torch.allclose(got, expected, atol=1e-6)
        ok &= passed
        print(f"  attention B={batch} H={heads} S={seq_len} D={head_dim} stride={stride}: "
              f"max |diff| {(got - expected).abs().max().item():.2e} "
              f"{'PASS' if passed else 'FAIL'}")

    embed_dim, num_heads, stride = 64, 4, 3
    naive = SimpleModel(embed_dim, num_heads, stride, NaiveStridedAttention).double().to(device)
    custom = SimpleModel(embed_dim, num_heads, stride, CustomStridedAttention).double().to(device)
    custom.load_state_dict(naive.state_dict())
    x = torch.randn(2, 50, embed_dim, dtype=torch.float64, device=device)
    with torch.no_grad():
        expected, got = naive(x), custom(x)
    passed = torch.allclose(got, expected, atol=1e-6)
    ok &= passed
    print(f"  SimpleModel E={embed_dim} H={num_heads} stride={stride}: max |diff| "
          f"{(got - expected).abs().max().item():.2e} {'PASS' if passed else 'FAIL'}")
    return ok


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def benchmark(json_path):
    if not torch.cuda.is_available():
        print("benchmark mode needs a CUDA GPU")
        return False
    batch, seq_len, embed_dim, num_heads, stride = 16, 1024, 512, 8, 4
    head_dim = embed_dim // num_heads
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, num_heads, seq_len, head_dim, device="cuda")
               for _ in range(3))
    naive_ms = median_ms(lambda: naive_strided_attention(q, k, v, stride), reps=10)
    ours_ms = median_ms(lambda: samattn.strided_attention(q, k, v, stride), reps=50)
    k_view, v_view = k[:, :, ::stride], v[:, :, ::stride]
    sdpa_ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k_view, v_view), reps=50)
    max_diff = (samattn.strided_attention(q, k, v, stride)
                - naive_strided_attention(q, k, v, stride)).abs().max().item()

    naive_model = SimpleModel(embed_dim, num_heads, stride, NaiveStridedAttention).cuda()
    custom_model = SimpleModel(embed_dim, num_heads, stride, CustomStridedAttention).cuda()
    custom_model.load_state_dict(naive_model.state_dict())
    x = torch.randn(batch, seq_len, embed_dim, device="cuda")
    with torch.no_grad():
        naive_model_ms = median_ms(lambda: naive_model(x), reps=5)
        custom_model_ms = median_ms(lambda: custom_model(x), reps=20)

    flops = 4 * batch * num_heads * seq_len * math.ceil(seq_len / stride) * head_dim
    print(f"  config: fp32 B={batch} S={seq_len} E={embed_dim} H={num_heads} stride={stride} "
          f"({torch.cuda.get_device_name()})")
    print(f"  naive loop            {naive_ms:9.3f} ms")
    print(f"  SDPA on k[:, :, ::{stride}]  {sdpa_ms:9.3f} ms")
    print(f"  samattn               {ours_ms:9.3f} ms  ({flops / ours_ms / 1e9:.1f} TFLOPS)")
    print(f"  speedup vs naive loop {naive_ms / ours_ms:9.1f}x")
    print(f"  speedup vs SDPA view  {sdpa_ms / ours_ms:9.2f}x")
    print(f"  max |samattn - naive| {max_diff:.2e}")
    print(f"  SimpleModel forward: naive {naive_model_ms:.3f} ms, samattn {custom_model_ms:.3f} ms "
          f"({naive_model_ms / custom_model_ms:.1f}x)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "commit": os.environ.get("SAMATTN_COMMIT", "unknown"),
                       "date": datetime.date.today().isoformat(),
                       "config": {"dtype": "float32", "batch": batch, "seq_len": seq_len,
                                  "embed_dim": embed_dim, "heads": num_heads, "stride": stride},
                       "naive_ms": naive_ms, "sdpa_view_ms": sdpa_ms, "samattn_ms": ours_ms,
                       "speedup_vs_naive": naive_ms / ours_ms,
                       "speedup_vs_sdpa_view": sdpa_ms / ours_ms, "max_abs_diff": max_diff,
                       "model_naive_ms": naive_model_ms, "model_samattn_ms": custom_model_ms},
                      f, indent=1)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["correctness", "benchmark"], default="correctness")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="write the benchmark numbers to this file")
    args = parser.parse_args()
    if args.mode == "correctness":
        print(f"correctness on {args.device}:")
        ok = check_correctness(args.device)
    else:
        print("benchmark:")
        ok = benchmark(args.json)
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
