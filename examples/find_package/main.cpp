// Ring attention on 2 thread ranks through seqpar's single algorithm API, checked against the
// fp64 oracle (reference_attention): the example that CI builds against the installed package.
#include <cmath>
#include <cstdio>
#include <random>

#include "seqpar/distributed_attention.hpp"

using namespace seqpar;

int main() {
  const int P = 2;
  const int64_t B = 1, S = 96, H = 4, H_kv = 2, D = 16;
  const DType t = DType::kF64;
  // Global inputs, normal(0, 1).
  HostTensor q(t, {B, S, H, D}), k(t, {B, S, H_kv, D}), v(t, {B, S, H_kv, D}), dout(t, {B, S, H, D});
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  for (HostTensor* x : {&q, &k, &v, &dout})
    for (int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] = normal(rng);

  AttentionParams params;
  params.mask = MaskSpec::causal();
  StatusOr<Layout> layout = Layout::create(LayoutKind::kZigzag, S, P);
  if (!layout.ok()) return std::printf("%s\n", layout.status().to_string().c_str()), 1;

  HostTensor o(t, {B, S, H, D}), lse(t, {B, H, S}), dq(t, {B, S, H, D});
  const Layout& lay = layout.value();
  // Each rank shards the global tensors, runs the planned ring forward and backward, and writes
  // its rows of O, LSE and dQ back (each rank writes only its own rows).
  Status status = run_local_ranks(P, [&](Communicator& comm) -> Status {
    const int r = comm.rank();
    const int64_t n = lay.local_len(r);
    const BlockBytes bytes{B, H, H_kv, D, t, t, t, true};
    SP_ASSIGN_OR_RETURN(const AttentionPlan plan,
                        plan_attention(PlanOptions("ring"), lay, params, bytes, r, cpu_kernel_backend()));
    HostTensor lq(t, {B, n, H, D}), lk(t, {B, n, H_kv, D}), lv(t, {B, n, H_kv, D}), ldo(t, {B, n, H, D});
    HostTensor lo(t, {B, n, H, D}), llse(t, {B, H, n}), ldq(t, {B, n, H, D}), ldk = lk, ldv = lv;
    SP_RETURN_IF_ERROR(lay.shard(q.view(), 1, r, lq.view()));
    SP_RETURN_IF_ERROR(lay.shard(k.view(), 1, r, lk.view()));
    SP_RETURN_IF_ERROR(lay.shard(v.view(), 1, r, lv.view()));
    SP_RETURN_IF_ERROR(lay.shard(dout.view(), 1, r, ldo.view()));
    const ShardTensors st{lq.view(), lk.view(), lv.view(), lo.view(), llse.view(),
                          ldo.view(), ldq.view(), ldk.view(), ldv.view()};
    SP_RETURN_IF_ERROR(run_forward_cpu(comm, plan, st));
    SP_RETURN_IF_ERROR(run_backward_cpu(comm, plan, st));
    SP_RETURN_IF_ERROR(lay.unshard(lo.view(), 1, r, o.view()));
    SP_RETURN_IF_ERROR(lay.unshard(llse.view(), 2, r, lse.view()));
    return lay.unshard(ldq.view(), 1, r, dq.view());
  });
  if (!status.ok()) return std::printf("ring attention failed: %s\n", status.to_string().c_str()), 1;

  StatusOr<ReferenceResult> ref = reference_attention(q.view(), k.view(), v.view(), dout.view(), params);
  if (!ref.ok()) return std::printf("oracle failed: %s\n", ref.status().to_string().c_str()), 1;
  auto max_diff = [](const HostTensor& a, const HostTensor& b) {
    double m = 0;
    for (int64_t i = 0; i < a.numel(); ++i) m = std::fmax(m, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
    return m;
  };
  const double err = std::fmax(max_diff(o, ref->o), std::fmax(max_diff(lse, ref->lse), max_diff(dq, ref->dq)));
  const bool pass = err <= 1e-10;
  std::printf("seqpar ring attention, %d thread ranks, zigzag causal, S=%lld: max |err| vs oracle %.3g (O, LSE, dQ): %s\n",
              P, static_cast<long long>(S), err, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
