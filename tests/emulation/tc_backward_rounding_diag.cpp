// Diagnosis of the first H100 run of the tensor-core backward (commit 8c292ef): each failing
// C++ case's first out-of-tolerance element (tc_backward_h100_failures.txt: scenario, dtype,
// gradient 0/1/2 = dq/dk/dv, element, the GPU's value) against the same-dtype reference of
// tests/cpp/backward_rounding_model.h on the same test data (same seeds), and, per gradient, the
// number of elements of that reference the old dtype-only rule rejects (compare with the GPU's
// counts in the log). CPU only:
//   g++ -O2 -std=c++17 -I csrc -I csrc/include -I tests/cpp -I /usr/local/cuda/include \
//     tests/emulation/tc_backward_rounding_diag.cpp csrc/reference/*.cpp \
//     csrc/attention/validate.cpp csrc/common/types.cpp -L/usr/local/cuda/lib64 -lcudart -lgtest \
//     -lpthread -o /tmp/diag && /tmp/diag < tests/emulation/tc_backward_h100_failures.txt
#include <cstdio>
#include <map>
#include "backward_rounding_model.h"
using namespace samattn;
using namespace samattn::testing;
struct BP {
  Problem fwd;
  HostTensor dout, dq, dk, dv;
  std::vector<float> lse32;
  AttentionBackwardParams params;
  BP(const Shape& s, DType dtype, bool causal, int64_t kv_stride, bool seq_major, uint64_t seed,
     double scale)
      : fwd(s, dtype, seq_major, seed) {
    fwd.params.causal = causal;
    fwd.params.kv_stride = kv_stride;
    if (scale != 0) fwd.params.softmax_scale = scale;
    fwd.out = fwd.reference(true);
    lse32.assign(fwd.lse.begin(), fwd.lse.end());
    dout = HostTensor(dtype, fwd.out.size());
    fill_random(dout, seed + 3);
    dq = HostTensor(dtype, fwd.q.size());
    dk = HostTensor(dtype, fwd.k.size());
    dv = HostTensor(dtype, fwd.v.size());
    params.forward = fwd.params;
    params.dout_strides = fwd.params.out_strides;
    params.dq_strides = fwd.params.q_strides;
    params.dk_strides = fwd.params.k_strides;
    params.dv_strides = fwd.params.v_strides;
    fwd.bind_host();
    params.forward.q = fwd.q.data();
    params.forward.k = fwd.k.data();
    params.forward.v = fwd.v.data();
    params.forward.out = fwd.out.data();
    params.forward.lse = lse32.data();
    params.dout = dout.data();
    params.dq = dq.data();
    params.dk = dk.data();
    params.dv = dv.data();
  }
};
int main(int argc, char** argv) {
  const Scenario all[] = {
      {"dense", {2, 3, 3, 77, 129, 64, 64}},
      {"causal", {2, 2, 2, 129, 129, 64, 64}, true},
      {"causal_sq_gt_sk", {1, 2, 2, 100, 37, 32, 32}, true},
      {"causal_sq_lt_sk_128", {1, 2, 2, 37, 100, 128, 128}, true},
      {"kv_stride3", {2, 2, 2, 65, 130, 64, 64}, false, 3},
      {"kv_stride4_causal_128", {1, 2, 2, 200, 200, 128, 128}, true, 4},
      {"kv_stride_larger_than_keys", {1, 1, 1, 20, 30, 32, 32}, true, 50},
      {"gqa_4to1", {2, 8, 2, 33, 70, 64, 64}},
      {"gqa_4to1_causal_128", {1, 8, 2, 130, 140, 128, 128}, true},
      {"mqa_causal_96", {1, 6, 1, 40, 41, 96, 96}, true},
      {"seq_major_layout", {2, 4, 2, 50, 61, 64, 64}, false, 1, true},
      {"seq_major_causal_128", {1, 4, 4, 77, 77, 128, 128}, true, 1, true},
      {"head_dim_96", {1, 2, 2, 70, 90, 96, 96}, true},
      {"single_query", {3, 2, 2, 1, 300, 128, 128}},
      {"single_key", {1, 2, 2, 20, 1, 64, 64}},
      {"long_causal", {1, 1, 1, 1000, 1000, 64, 64}, true, 1, false, 0.3},
      {"long_keys_128", {1, 2, 2, 77, 1000, 128, 128}},
      {"negative_scale", {1, 2, 2, 30, 40, 64, 64}, true, 1, false, -0.2},
      {"auto_64", {1, 4, 2, 70, 90, 64, 64}, true},
  };
  // args: name dtype(f16|bf16) grad(0,1,2) element got  (repeated via stdin lines)
  char name[64], dt[16];
  int grad;
  long long elem;
  double got;
  std::map<std::string, const Scenario*> by;
  for (auto& s : all) by[s.name] = &s;
  while (scanf("%63s %15s %d %lld %lf", name, dt, &grad, &elem, &got) == 5) {
    const Scenario& sc = *by.at(name);
    const DType dtype = std::string(dt) == "float16" ? DType::kFloat16 : DType::kBFloat16;
    BP pb(sc.shape, dtype, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(), sc.scale);
    const RoundedBackward m = rounded_backward(pb.params, pb.dq.size(), pb.dk.size(), pb.dv.size());
    reference_attention_backward(pb.params);
    const HostTensor* refs[] = {&pb.dq, &pb.dk, &pb.dv};
    const HostTensor* mods[] = {&m.dq, &m.dk, &m.dv};
    const std::vector<double>* terms[] = {&m.dq_terms, &m.dk_terms, &m.dv_terms};
    const double scale = std::fabs(sc.scale ? sc.scale : default_softmax_scale(sc.shape.head_dim));
    const double dp = max_abs(pb.dout) * max_abs(pb.fwd.v);
    const double floors[] = {scale * dp * max_abs(pb.fwd.k), scale * dp * max_abs(pb.fwd.q),
                             max_abs(pb.dout)};
    const char* gn[] = {"dq", "dk", "dv"};
    const double u = unit_roundoff_16(dtype);
    printf(
        "%s %s %s[%lld]: ref %.6f model %.6f GPU %.6f | |GPU-ref| %.2e |model-ref| %.2e u*terms "
        "%.2e\n",
        name, dt, gn[grad], elem, refs[grad]->get(elem), mods[grad]->get(elem), got,
        std::fabs(got - refs[grad]->get(elem)),
        std::fabs(mods[grad]->get(elem) - refs[grad]->get(elem)), u * (*terms[grad])[elem]);
    for (int g = 0; g < 3; ++g) {
      auto old_rule = all_close(*mods[g], *refs[g], dtype, floors[g]);
      auto new_rule =
          within_backward_rule(*mods[g], *refs[g], *mods[g], *terms[g], dtype, floors[g]);
      printf("    model %s old rule: %s | new rule on model: %s\n", gn[g],
             old_rule ? "pass" : old_rule.message(), new_rule ? "pass" : new_rule.message());
    }
    fflush(stdout);
  }
}
// validate.cpp refers to it; the reference never needs a workspace.
namespace samattn {
size_t attention_backward_workspace_bytes(const AttentionBackwardParams&) { return 0; }
}  // namespace samattn
