// Uses the installed C++ API: a can_implement query, the CPU reference, and an error message.
#include <cmath>
#include <cstdio>
#include <vector>

#include <samattn/samattn.h>

int main() {
  const int64_t seqlen = 4, dim = 2;
  std::vector<float> q(seqlen * dim, 0.0f), k(seqlen * dim, 0.5f), v(seqlen * dim), out(seqlen * dim);
  for (int64_t i = 0; i < seqlen * dim; ++i) v[i] = static_cast<float>(i);

  samattn::AttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.dtype = samattn::DType::kFloat32;
  p.batch = p.heads_q = p.heads_kv = 1;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = p.head_dim_v = dim;
  p.q_strides = p.k_strides = p.v_strides = p.out_strides = {seqlen * dim, seqlen * dim, dim};
  p.causal = true;
  if (!samattn::can_implement(p).ok()) return 1;
  samattn::reference_attention_forward(p);
  // Zero queries: causal row i averages value rows 0..i; row 3 averages all four.
  const float expected = (0 + 2 + 4 + 6) / 4.0f;
  if (std::fabs(out[3 * dim] - expected) > 1e-6f) return 2;

  p.kv_stride = 0;
  const samattn::Status status = samattn::can_implement(p);
  std::printf("samattn %s consumer ok; invalid kv_stride reports: %s\n", samattn::kVersion,
              status.message().c_str());
  return status.ok() ? 3 : 0;
}
