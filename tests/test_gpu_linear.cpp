// Our CUDA linear-attention kernels (kernels/cuda/linear_cuda.hpp) against the fp64 oracle under the
// bf16 rule, with tests/linear_lowp.hpp as the plain low-precision baseline: decay 1, 0.9 and
// per head, GQA, d_k != d_v, incoming state and dState, lengths that are not multiples of the
// chunk, many spans; a chain of calls on slices against one call; refusals. Run anywhere: the
// rule's own tests (the baseline is close to the oracle; a decay exponent off by one fails the
// rule) and the same cases through a host replay of the kernels' steps (linear_emulator.hpp);
// the GPU tests skip without a device.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/linear_host.hpp"
#include "linear_emulator.hpp"
#include "linear_lowp.hpp"
#include "linear_test_util.hpp"
#include "seqpar/gpu.hpp"
#include "kernels/cuda/linear_cuda.hpp"

namespace seqpar {
namespace {

using testing::cast;
using testing::LinearProblem;

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here"

struct Case {
  LinearProblem p;
  DType dtype = DType::kBF16;
  int64_t chunks_per_span = 0;  // 0: the kernels' choice
  bool with_states = true;      // nonzero state_in and dstate_out
  std::string label;
};

struct Inputs {
  HostTensor q, k, v, dout, state_in, dstate_out;  // states fp32
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  const testing::LinearInputs in = testing::make_linear_inputs(c.p, c.dtype, seed);
  return {in.q, in.k, in.v, in.dout, cast(in.state_in, DType::kF32), cast(in.dstate_out, DType::kF32)};
}

// Device copies of the inputs and fp32/dtype outputs; results come back as fp64 host tensors.
struct GpuRun {
  HostTensor o, state_out, dq, dk, dv, dstate_in;
};

// The inputs on the device.
struct DeviceInputs {
  DeviceTensor q, k, v, dout, s_in, ds_out;
};
StatusOr<DeviceInputs> upload(const Inputs& in) {
  DeviceInputs d;
  for (auto [dst, src] : {std::pair{&d.q, &in.q}, {&d.k, &in.k}, {&d.v, &in.v}, {&d.dout, &in.dout},
                          {&d.s_in, &in.state_in}, {&d.ds_out, &in.dstate_out}}) {
    SP_ASSIGN_OR_RETURN(*dst, to_device(*src));
  }
  return d;
}

StatusOr<GpuRun> run_gpu(const Case& c, const Inputs& in, bool backward, bool pipelined) {
  const LinearProblem& p = c.p;
  SP_ASSIGN_OR_RETURN(DeviceInputs d, upload(in));
  const DeviceTensor &q = d.q, &k = d.k, &v = d.v, &dout = d.dout, &s_in = d.s_in, &ds_out = d.ds_out;
  SP_ASSIGN_OR_RETURN(DeviceTensor o, device_zeros(c.dtype, {p.batch, p.seq, p.heads, p.dv}));
  SP_ASSIGN_OR_RETURN(DeviceTensor s_out, device_zeros(DType::kF32, {p.batch, p.heads, p.dk, p.dv}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dq, device_zeros(c.dtype, {p.batch, p.seq, p.heads, p.dk}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dk, device_zeros(c.dtype, {p.batch, p.seq, p.kv_heads, p.dk}));
  SP_ASSIGN_OR_RETURN(DeviceTensor dv, device_zeros(c.dtype, {p.batch, p.seq, p.kv_heads, p.dv}));
  SP_ASSIGN_OR_RETURN(DeviceTensor ds_in, device_zeros(DType::kF32, {p.batch, p.heads, p.dk, p.dv}));
  const TensorView state_in = c.with_states ? s_in.view : TensorView{};
  const TensorView dstate_out = c.with_states ? ds_out.view : TensorView{};
  LinearCudaOptions options;
  options.chunks_per_span = c.chunks_per_span;
  options.pipelined = pipelined;
  SP_RETURN_IF_ERROR(linear_attention_forward_cuda(q.view, k.view, v.view, state_in, p.params(), o.view,
                                                   s_out.view, options));
  if (backward)
    SP_RETURN_IF_ERROR(linear_attention_backward_cuda(q.view, k.view, v.view, state_in, dout.view, dstate_out,
                                                      p.params(), dq.view, dk.view, dv.view, ds_in.view, options));
  GpuRun r;
  for (auto [dst, src] : {std::pair{&r.o, &o}, {&r.state_out, &s_out}, {&r.dq, &dq}, {&r.dk, &dk},
                          {&r.dv, &dv}, {&r.dstate_in, &ds_in}}) {
    SP_ASSIGN_OR_RETURN(HostTensor host, to_host(src->view));
    *dst = cast(host, DType::kF64);
  }
  return r;
}

// The steps the GPU would launch, replayed on the host over host tensors.
StatusOr<GpuRun> run_emulated(const Case& c, const Inputs& in) {
  const LinearProblem& p = c.p;
  cuda::LinearCudaDims d;
  SP_RETURN_IF_ERROR(cuda::check_linear_cuda(in.q.view(), in.k.view(), in.v.view(), p.params(), &d, false));
  const cuda::LinearPlan plan = cuda::plan_linear(d, c.chunks_per_span);
  HostTensor o(c.dtype, {p.batch, p.seq, p.heads, p.dv}), s_out(DType::kF32, {p.batch, p.heads, p.dk, p.dv});
  HostTensor dq(c.dtype, {p.batch, p.seq, p.heads, p.dk}), dk(c.dtype, {p.batch, p.seq, p.kv_heads, p.dk});
  HostTensor dv(c.dtype, {p.batch, p.seq, p.kv_heads, p.dv}), ds_in(DType::kF32, {p.batch, p.heads, p.dk, p.dv});
  const TensorView state_in = c.with_states ? in.state_in.view() : TensorView{};
  const TensorView dstate_out = c.with_states ? in.dstate_out.view() : TensorView{};
  std::vector<float> ws(std::max(cuda::linear_forward_workspace(d, plan), cuda::linear_backward_workspace(d, plan)) + 1);
  testing::emulate_linear_steps(cuda::linear_forward_steps(d, plan, p.params(), in.q.view(), in.k.view(),
                                                           in.v.view(), state_in, o.view(), s_out.view(), ws.data()),
                                d);
  testing::emulate_linear_steps(
      cuda::linear_backward_steps(d, plan, p.params(), in.q.view(), in.k.view(), in.v.view(), state_in,
                                  in.dout.view(), dstate_out, dq.view(), dk.view(), dv.view(), ds_in.view(), ws.data()),
      d);
  return GpuRun{cast(o, DType::kF64),  cast(s_out, DType::kF64), cast(dq, DType::kF64),
                cast(dk, DType::kF64), cast(dv, DType::kF64),    cast(ds_in, DType::kF64)};
}

// The oracle (fp64, recurrent form) and the plain low-precision baseline of one case.
struct Expected {
  LinearReferenceResult oracle, plain;
};

Expected expected(const Case& c, const Inputs& in, int intra_decay_shift = 0) {
  const TensorView s_in = c.with_states ? in.state_in.view() : TensorView{};
  const TensorView ds_out = c.with_states ? in.dstate_out.view() : TensorView{};
  auto oracle = linear_attention_reference(in.q.view(), in.k.view(), in.v.view(), s_in, in.dout.view(), ds_out,
                                           c.p.params(), LinearOracleForm::kRecurrent);
  EXPECT_TRUE(oracle.ok()) << oracle.status().to_string();
  return {oracle.value(), testing::plain_lowp_linear(in.q, in.k, in.v, c.with_states ? &in.state_in : nullptr,
                                                     &in.dout, c.with_states ? &in.dstate_out : nullptr,
                                                     c.p.params(), c.dtype, intra_decay_shift)};
}

// "" when every output meets the rule, else the failures.
std::string check_all(const GpuRun& ours, const Expected& e, DType dtype) {
  std::string why;
  const auto add = [&](const char* what, const HostTensor& got, const HostTensor& plain, const HostTensor& oracle,
                       DType rounding) {
    const std::string w = testing::check_lowp_rule(what, got, plain, oracle, rounding);
    if (!w.empty()) why += w + "\n";
  };
  add("O", ours.o, e.plain.o, e.oracle.o, dtype);
  add("state_out", ours.state_out, e.plain.state_out, e.oracle.state_out, DType::kF32);
  add("dQ", ours.dq, e.plain.dq, e.oracle.dq, dtype);
  add("dK", ours.dk, e.plain.dk, e.oracle.dk, dtype);
  add("dV", ours.dv, e.plain.dv, e.oracle.dv, dtype);
  add("dstate_in", ours.dstate_in, e.plain.dstate_in, e.oracle.dstate_in, DType::kF32);
  return why;
}

std::string name(const Case& c) {
  return c.label + "_N" + std::to_string(c.p.seq) + "_H" + std::to_string(c.p.heads) + "_Hkv" +
         std::to_string(c.p.kv_heads) + "_dk" + std::to_string(c.p.dk) + "_dv" + std::to_string(c.p.dv) + "_" +
         dtype_name(c.dtype) + "_span" + std::to_string(c.chunks_per_span);
}

Case make_case(std::string label, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t dk,
               int64_t dv, std::vector<double> decay, double scale, DType dtype, int64_t chunks_per_span,
               bool with_states = true) {
  Case c;
  c.p.batch = batch, c.p.seq = seq, c.p.heads = heads, c.p.kv_heads = kv_heads, c.p.dk = dk, c.p.dv = dv;
  c.p.decay = std::move(decay);
  c.p.scale = scale;
  c.dtype = dtype;
  c.chunks_per_span = chunks_per_span;
  c.with_states = with_states;
  c.label = std::move(label);
  return c;
}

void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

std::vector<Case> cases() {
  const std::vector<double> per_head{0.999, 0.9, 0.5, 0.99};
  const DType bf16 = DType::kBF16;
  return {
      // label, B, N, H, H_kv, d_k, d_v, decay, scale, dtype, chunks per span (0: auto)
      make_case("decay1", 1, 1000, 2, 2, 64, 64, {1.0}, 1.0, bf16, 0),
      make_case("decay09", 1, 1000, 2, 2, 128, 128, {0.9}, 1.0, bf16, 3),
      make_case("perhead_gqa", 1, 777, 4, 2, 128, 64, per_head, 1.0, bf16, 2),
      make_case("perhead_mqa", 1, 1500, 4, 1, 64, 128, per_head, 0.125, bf16, 1),
      make_case("batch2", 2, 333, 4, 4, 128, 128, {0.98}, 0.088, bf16, 1),
      make_case("fp16", 1, 300, 2, 1, 64, 64, {0.95}, 1.0, DType::kF16, 2),
      make_case("nostate", 1, 130, 2, 2, 64, 128, {0.9}, 1.0, bf16, 1, false),
      make_case("onechunk", 1, 64, 2, 2, 128, 64, {0.8}, 1.0, bf16, 0),
      make_case("onetoken", 1, 1, 2, 2, 64, 64, {0.9}, 1.0, bf16, 0),
      make_case("chunkplus1", 1, 65, 2, 2, 64, 64, {0.9}, 1.0, bf16, 1),
      make_case("long", 1, 4096, 2, 2, 128, 128, {0.999}, 0.088, bf16, 0),
  };
}

class GpuLinear : public ::testing::TestWithParam<Case> {};

// Both kernel variants: one tile stage, and two (pipelined).
TEST_P(GpuLinear, MeetsTheLowPrecisionRule) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 101);
  const Expected e = expected(c, in);
  for (bool pipelined : {false, true}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "one stage");
    auto ours = run_gpu(c, in, true, pipelined);
    ASSERT_TRUE(ours.ok()) << ours.status().to_string();
    const std::string why = check_all(ours.value(), e, c.dtype);
    EXPECT_TRUE(why.empty()) << why;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuLinear, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name(info.param); });

class GpuLinearEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(GpuLinearEmulated, MeetsTheLowPrecisionRule) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 101);
  auto ours = run_emulated(c, in);
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  const std::string why = check_all(ours.value(), expected(c, in), c.dtype);
  EXPECT_TRUE(why.empty()) << why;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuLinearEmulated, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name(info.param); });

// The rule is tight enough to matter: the baseline itself is close to the oracle, and the same
// baseline with every intra-chunk decay exponent one too large fails the rule. No GPU needed.
TEST(GpuLinearRule, CatchesADecayExponentOffByOne) {
  const Case c = make_case("rule", 1, 200, 2, 1, 64, 64, {0.9, 0.99}, 1.0, DType::kBF16, 0);
  const Inputs in = make_inputs(c, 7);
  const Expected e = expected(c, in);
  for (const auto& [what, plain, oracle] :
       {std::tuple{"O", &e.plain.o, &e.oracle.o}, {"dQ", &e.plain.dq, &e.oracle.dq},
        {"dK", &e.plain.dk, &e.oracle.dk}, {"dV", &e.plain.dv, &e.oracle.dv}}) {
    const double err = testing::max_abs_diff(*plain, *oracle), size = testing::max_abs(*oracle);
    EXPECT_LE(err, 0.02 * size) << what << ": the baseline is off by " << err << " at magnitude " << size;
  }
  const Expected wrong = expected(c, in, 1);
  GpuRun as_ours{wrong.plain.o, wrong.plain.state_out, wrong.plain.dq, wrong.plain.dk, wrong.plain.dv,
                 wrong.plain.dstate_in};
  const std::string why = check_all(as_ours, e, c.dtype);
  for (const char* what : {"O:", "dQ:", "dK:", "dV:"})
    EXPECT_NE(why.find(what), std::string::npos) << what << " passed with a wrong decay exponent";
}

// Slices of one sequence, called one after another with state_out -> state_in (forward) and
// dstate_in -> dstate_out (backward, last slice first), against one call on the whole.
class GpuLinearChain : public ::testing::TestWithParam<bool> {};  // pipelined or not

TEST_P(GpuLinearChain, SlicesCalledInTurnMatchOneCall) {
  SKIP_WITHOUT_GPU();
  const Case c = make_case("chain", 1, 1000, 4, 2, 128, 64, {0.999, 0.9, 0.5, 0.99}, 0.1, DType::kBF16, 2);
  const LinearProblem& p = c.p;
  const Inputs in = make_inputs(c, 23);
  auto whole = run_gpu(c, in, true, GetParam());
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  const std::vector<int64_t> cuts{0, 300, 364, 1000};  // 300, 64 and 636 tokens

  auto dev = [](const HostTensor& t) { return to_device(t).value(); };
  DeviceTensor q = dev(in.q), k = dev(in.k), v = dev(in.v), dout = dev(in.dout);
  DeviceTensor o = device_zeros(c.dtype, {1, p.seq, p.heads, p.dv}).value();
  DeviceTensor dq = device_zeros(c.dtype, {1, p.seq, p.heads, p.dk}).value();
  DeviceTensor dk = device_zeros(c.dtype, {1, p.seq, p.kv_heads, p.dk}).value();
  DeviceTensor dv = device_zeros(c.dtype, {1, p.seq, p.kv_heads, p.dv}).value();
  const size_t parts = cuts.size() - 1;
  std::vector<DeviceTensor> states;  // states[i]: entering slice i; states[parts]: the last state_out
  states.push_back(dev(in.state_in));
  LinearCudaOptions options;
  options.chunks_per_span = c.chunks_per_span;
  options.pipelined = GetParam();
  for (size_t i = 0; i < parts; ++i) {
    states.push_back(device_zeros(DType::kF32, {1, p.heads, p.dk, p.dv}).value());
    const auto part = [&](const DeviceTensor& t) { return t.view.narrow(1, cuts[i], cuts[i + 1]); };
    const Status s = linear_attention_forward_cuda(part(q), part(k), part(v), states[i].view, p.params(),
                                                   part(o), states[i + 1].view, options);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  DeviceTensor dstate = dev(in.dstate_out);
  for (size_t i = parts; i-- > 0;) {
    DeviceTensor earlier = device_zeros(DType::kF32, {1, p.heads, p.dk, p.dv}).value();
    const auto part = [&](const DeviceTensor& t) { return t.view.narrow(1, cuts[i], cuts[i + 1]); };
    const Status s = linear_attention_backward_cuda(part(q), part(k), part(v), states[i].view, part(dout),
                                                    dstate.view, p.params(), part(dq), part(dk), part(dv),
                                                    earlier.view, options);
    ASSERT_TRUE(s.ok()) << s.to_string();
    dstate = std::move(earlier);
  }
  GpuRun chain;
  for (auto [dst, src] : {std::pair{&chain.o, &o}, {&chain.state_out, &states[parts]}, {&chain.dq, &dq},
                          {&chain.dk, &dk}, {&chain.dv, &dv}, {&chain.dstate_in, &dstate}})
    *dst = cast(to_host(src->view).value(), DType::kF64);
  // The chain against the oracle, with the single call as its baseline: within twice the single
  // call's error (plus rounding), and both within the bf16 rule.
  const Expected e = expected(c, in);
  EXPECT_EQ(check_all(whole.value(), e, c.dtype), "");
  EXPECT_EQ(check_all(chain, e, c.dtype), "");
  const Expected single{e.oracle, {whole->o, whole->state_out, whole->dq, whole->dk, whole->dv, whole->dstate_in}};
  EXPECT_EQ(check_all(chain, single, c.dtype), "");
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuLinearChain, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "pipelined" : "one_stage"; });

// Diagnosis rather than acceptance: one backward's steps (both state sweeps and scans, the dq,
// dv, dk sweeps, the GQA sums) run one at a time on the GPU and in the host replay; after each
// step every buffer must agree closely (the same rounding points, only the fp32 summation order
// differs). A failure names the first step and buffer that differ.
class GpuLinearSteps : public ::testing::TestWithParam<bool> {};  // pipelined or not

TEST_P(GpuLinearSteps, EachStepMatchesItsHostReplay) {
  SKIP_WITHOUT_GPU();
  const Case c = make_case("steps", 1, 300, 4, 2, 128, 64, {0.999, 0.9, 0.5, 0.99}, 0.1, DType::kBF16, 2);
  const LinearProblem& p = c.p;
  const Inputs in = make_inputs(c, 5);
  cuda::LinearCudaDims d;
  ASSERT_TRUE(cuda::check_linear_cuda(in.q.view(), in.k.view(), in.v.view(), p.params(), &d, false).ok());
  const cuda::LinearPlan plan = cuda::plan_linear(d, c.chunks_per_span);
  const size_t ws_floats = cuda::linear_backward_workspace(d, plan);
  // Host buffers, and their device twins: the outputs and the workspace (as [ws_floats] fp32).
  std::vector<HostTensor> host{HostTensor(c.dtype, {p.batch, p.seq, p.heads, p.dk}),
                               HostTensor(c.dtype, {p.batch, p.seq, p.kv_heads, p.dk}),
                               HostTensor(c.dtype, {p.batch, p.seq, p.kv_heads, p.dv}),
                               HostTensor(DType::kF32, {p.batch, p.heads, p.dk, p.dv}),
                               HostTensor(DType::kF32, {int64_t(ws_floats)})};
  const char* names[] = {"dq", "dk", "dv", "dstate_in", "workspace"};
  std::vector<DeviceTensor> dev;
  for (const HostTensor& t : host) dev.push_back(to_device(t).value());
  std::vector<DeviceTensor> inputs;
  for (const HostTensor* t : {&in.q, &in.k, &in.v, &in.dout, &in.state_in, &in.dstate_out})
    inputs.push_back(to_device(*t).value());
  const auto host_steps = cuda::linear_backward_steps(
      d, plan, p.params(), in.q.view(), in.k.view(), in.v.view(), in.state_in.view(), in.dout.view(),
      in.dstate_out.view(), host[0].view(), host[1].view(), host[2].view(), host[3].view(), host[4].data<float>());
  const auto dev_steps = cuda::linear_backward_steps(
      d, plan, p.params(), inputs[0].view, inputs[1].view, inputs[2].view, inputs[4].view, inputs[3].view,
      inputs[5].view, dev[0].view, dev[1].view, dev[2].view, dev[3].view, static_cast<float*>(dev[4].view.data));
  ASSERT_EQ(host_steps.size(), dev_steps.size());
  for (size_t i = 0; i < host_steps.size(); ++i) {
    testing::emulate_linear_steps({host_steps[i]}, d);
    const Status s = cuda::run_linear_steps({dev_steps[i]}, d, nullptr, GetParam());
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (size_t b = 0; b < host.size(); ++b) {
      const HostTensor got = to_host(dev[b].view).value();
      const double err = testing::max_abs_diff(got, host[b]), size = testing::max_abs(host[b]);
      ASSERT_LE(err, 1e-2 * std::max(size, 1e-3))
          << "step " << i << " (kind " << int(host_steps[i].kind) << (host_steps[i].reverse ? ", reverse" : "")
          << (host_steps[i].output ? ", output" : ", states") << "): " << names[b] << " differs by " << err
          << " at magnitude " << size;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuLinearSteps, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "pipelined" : "one_stage"; });

// The passes LASP runs before a neighbour's state is known: the forward with o empty (state_out
// alone) and the backward with dq, dk, dv empty (dstate_in alone) give the same states as the
// full passes, bit for bit (the same steps on the same inputs), in the host replay and on the GPU.
struct StatesAlone {
  HostTensor state_out, dstate_in;
};

StatesAlone states_alone_emulated(const Case& c, const Inputs& in) {
  const LinearProblem& p = c.p;
  cuda::LinearCudaDims d;
  EXPECT_TRUE(cuda::check_linear_cuda(in.q.view(), in.k.view(), in.v.view(), p.params(), &d, false).ok());
  const cuda::LinearPlan plan = cuda::plan_linear(d, c.chunks_per_span);
  StatesAlone r{HostTensor(DType::kF32, {p.batch, p.heads, p.dk, p.dv}),
                HostTensor(DType::kF32, {p.batch, p.heads, p.dk, p.dv})};
  std::vector<float> ws(cuda::linear_backward_workspace(d, plan) + 1);
  testing::emulate_linear_steps(cuda::linear_forward_steps(d, plan, p.params(), in.q.view(), in.k.view(), in.v.view(),
                                                           in.state_in.view(), {}, r.state_out.view(), ws.data()),
                                d);
  testing::emulate_linear_steps(cuda::linear_backward_steps(d, plan, p.params(), in.q.view(), in.k.view(), in.v.view(),
                                                            {}, in.dout.view(), in.dstate_out.view(), {}, {}, {},
                                                            r.dstate_in.view(), ws.data()),
                                d);
  return {cast(r.state_out, DType::kF64), cast(r.dstate_in, DType::kF64)};
}

StatusOr<StatesAlone> states_alone_gpu(const Case& c, const Inputs& in) {
  const LinearProblem& p = c.p;
  SP_ASSIGN_OR_RETURN(DeviceInputs d, upload(in));
  const DeviceTensor &q = d.q, &k = d.k, &v = d.v, &dout = d.dout, &s_in = d.s_in, &ds_out = d.ds_out;
  SP_ASSIGN_OR_RETURN(DeviceTensor s_out, device_zeros(DType::kF32, {p.batch, p.heads, p.dk, p.dv}));
  SP_ASSIGN_OR_RETURN(DeviceTensor ds_in, device_zeros(DType::kF32, {p.batch, p.heads, p.dk, p.dv}));
  LinearCudaOptions options;
  options.chunks_per_span = c.chunks_per_span;
  SP_RETURN_IF_ERROR(linear_attention_forward_cuda(q.view, k.view, v.view, s_in.view, p.params(), {}, s_out.view,
                                                   options));
  SP_RETURN_IF_ERROR(linear_attention_backward_cuda(q.view, k.view, v.view, {}, dout.view, ds_out.view, p.params(),
                                                    {}, {}, {}, ds_in.view, options));
  SP_ASSIGN_OR_RETURN(HostTensor a, to_host(s_out.view));
  SP_ASSIGN_OR_RETURN(HostTensor b, to_host(ds_in.view));
  return StatesAlone{cast(a, DType::kF64), cast(b, DType::kF64)};
}

const Case& states_alone_case() {
  static const Case c = make_case("alone", 2, 700, 4, 2, 128, 64, {0.999, 0.9, 0.5, 0.99}, 0.1, DType::kBF16, 3);
  return c;
}

TEST(GpuLinearEmulated, StatesAloneMatchTheFullPasses) {
  const Case& c = states_alone_case();
  const Inputs in = make_inputs(c, 31);
  auto full = run_emulated(c, in);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  const StatesAlone alone = states_alone_emulated(c, in);
  EXPECT_EQ(testing::max_abs_diff(alone.state_out, full->state_out), 0.0);
  EXPECT_EQ(testing::max_abs_diff(alone.dstate_in, full->dstate_in), 0.0);
  EXPECT_GT(testing::max_abs(alone.dstate_in), 0.0);
}

TEST(GpuLinearPartial, StatesAloneMatchTheFullPasses) {
  SKIP_WITHOUT_GPU();
  const Case& c = states_alone_case();
  const Inputs in = make_inputs(c, 31);
  auto full = run_gpu(c, in, true, false);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  auto alone = states_alone_gpu(c, in);
  ASSERT_TRUE(alone.ok()) << alone.status().to_string();
  EXPECT_EQ(testing::max_abs_diff(alone->state_out, full->state_out), 0.0);
  EXPECT_EQ(testing::max_abs_diff(alone->dstate_in, full->dstate_in), 0.0);
}

TEST(GpuLinearChecks, RefusesWhatItCannotDo) {
  SKIP_WITHOUT_GPU();
  const LinearAttentionParams params{{0.9}, 1.0, 64};
  auto make = [](DType t, std::vector<int64_t> shape) { return device_zeros(t, shape).value(); };
  DeviceTensor q = make(DType::kBF16, {1, 64, 2, 64}), o = make(DType::kBF16, {1, 64, 2, 64});
  DeviceTensor s = make(DType::kF32, {1, 2, 64, 64});
  Status st = linear_attention_forward_cuda(q.view, q.view, q.view, {}, params, o.view, s.view);
  EXPECT_TRUE(st.ok()) << st.to_string();
  DeviceTensor q32 = make(DType::kBF16, {1, 64, 2, 32});
  st = linear_attention_forward_cuda(q32.view, q32.view, q32.view, {}, params, {}, {});
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  DeviceTensor f32 = make(DType::kF32, {1, 64, 2, 64});
  st = linear_attention_forward_cuda(f32.view, f32.view, f32.view, {}, params, {}, {});
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  const HostTensor host = testing::random_tensor(DType::kBF16, {1, 64, 2, 64}, 1);
  st = linear_attention_forward_cuda(host.view(), host.view(), host.view(), {}, params, {}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  const LinearAttentionParams bad{{1.5}, 1.0, 64};
  st = linear_attention_forward_cuda(q.view, q.view, q.view, {}, bad, {}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  DeviceTensor wrong_state = make(DType::kBF16, {1, 2, 64, 64});
  st = linear_attention_forward_cuda(q.view, q.view, q.view, wrong_state.view, params, {}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

}  // namespace
}  // namespace seqpar
