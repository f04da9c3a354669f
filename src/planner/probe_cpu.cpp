// `seqpar probe` on the CPU: the CPU attention backend in fp32, thread ranks over the local
// communicator, the BLAS the training engine links, memcpy, and the machine's memory. This is
// the path CI runs; its figures describe this host, not a GPU node.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "planner/probe.hpp"
#include "planner/probe_sweeps.hpp"
#include "seqpar/attention.hpp"
#include "seqpar/distributed_attention.hpp"
#ifdef SEQPAR_HAVE_MODEL
#include <cblas.h>
#endif

namespace seqpar::planner {
namespace {

class HostProbeMemory final : public ProbeMemory {
 public:
  StatusOr<TensorView> random(DType dtype, const std::vector<int64_t>& shape) override {
    HostTensor& t = tensors_.emplace_back(dtype, shape);
    std::vector<float> values(size_t(t.numel()));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : values) x = uniform(rng_);
    convert(values.data(), DType::kF32, t.view().data, dtype, values.size());
    return t.view();
  }
  void release() override { tensors_.clear(); }
  StatusOr<double> median_seconds(const std::function<Status()>& call, int repeats) override {
    SP_RETURN_IF_ERROR(call());
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      Status status = Status::Ok();
      times.push_back(host_seconds([&] { status = call(); }));
      SP_RETURN_IF_ERROR(status);
    }
    return median(times);
  }

 private:
  std::vector<HostTensor> tensors_;
  std::mt19937_64 rng_{20261128};
};

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(' '));
      return name + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
    }
  return "cpu (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

const AttentionBackend* cpu_backend_named(const std::string& name) {
  if (name == "cpu") return &cpu_kernel_backend();
  if (name == "oracle") return &cpu_oracle_backend();
  return nullptr;
}

// A thread rank's distributed passes on host tensors, fp32, through the CPU executor.
class HostRankPasses final : public ProbeRankPasses {
 public:
  explicit HostRankPasses(const AttentionBackend& backend) : backend_(backend) {}
  Status prepare(Communicator& comm, const std::string& algorithm, const Layout& layout,
                 const ProbeOptions& o) override {
    SP_ASSIGN_OR_RETURN(t_, random_shard_tensors(memory_, DType::kF32, layout.local_len(comm.rank()), o));
    AttentionParams params;
    params.mask = MaskSpec::causal();
    SP_ASSIGN_OR_RETURN(AttentionPlan plan, plan_attention(PlanOptions(algorithm), layout, params,
                                                           block_bytes_for(t_.q, t_.k, backend_), comm.rank(), backend_));
    plan_ = std::make_unique<AttentionPlan>(std::move(plan));
    return Status::Ok();
  }
  Status run(Communicator& comm, Pass pass) override {
    return pass == Pass::kForward ? run_forward_cpu(comm, *plan_, t_) : run_backward_cpu(comm, *plan_, t_);
  }
  const AttentionPlan& plan() const override { return *plan_; }
  void release() override { plan_.reset(), memory_.release(); }

 private:
  const AttentionBackend& backend_;
  HostProbeMemory memory_;
  ShardTensors t_;
  std::unique_ptr<AttentionPlan> plan_;
};

}  // namespace

StatusOr<ProbeMeasurements> measure_cpu(const ProbeOptions& o, const ProbeLog& log) {
  ProbeMeasurements m;
  m.device_name = cpu_model_name();
  m.ranks = o.ranks;
  const std::string by = "seqpar probe on " + m.device_name;
  log("probe: " + m.device_name + ", " + std::to_string(o.ranks) + " thread rank(s)");

  // Attention: fp32 (the CPU kernels have no bf16), every backend asked for.
  const std::vector<std::string> backends = o.backends.empty() ? std::vector<std::string>{"cpu"} : o.backends;
  m.backend = backends.front();
  HostProbeMemory memory;
  for (const std::string& name : backends) {
    const AttentionBackend* backend = cpu_backend_named(name);
    SP_CHECK_ARG(backend != nullptr, "--backends: '" + name + "' is not a CPU backend (cpu, oracle)");
    SP_ASSIGN_OR_RETURN(const AttentionSweep sweep, sweep_attention(*backend, DType::kF32, memory, o, by + ", fp32", log));
    m.attention.insert(m.attention.end(), sweep.rows.begin(), sweep.rows.end());
  }

  // Launch: the time of the smallest attention call, its fixed cost.
  {
    const AttentionBackend& backend = *cpu_backend_named(m.backend);
    SP_ASSIGN_OR_RETURN(const TensorView q, memory.random(DType::kF32, {1, 1, 1, o.head_dim}));
    SP_ASSIGN_OR_RETURN(const TensorView kv, memory.random(DType::kF32, {1, 1, 1, o.head_dim}));
    SP_ASSIGN_OR_RETURN(const TensorView out, memory.random(DType::kF32, {1, 1, 1, o.head_dim}));
    SP_ASSIGN_OR_RETURN(const TensorView lse, memory.random(DType::kF32, {1, 1, 1}));
    AttentionParams params;
    SP_ASSIGN_OR_RETURN(m.launch_s, memory.median_seconds(
                                        [&] { return backend.forward(q, kv, kv, params, out, lse, FreshOutputs{true, false, false}, nullptr); },
                                        std::max(o.repeats, 20)));
    memory.release();
    log("probe: launch (a one-row attention call) " + std::to_string(m.launch_s * 1e6) + " us");
  }

  // Links: thread ranks over the local communicator, host buffers.
  if (o.ranks >= 2) {
    const size_t largest = size_t(o.message_bytes.back());
    LinkSweep sweep;
    const Status status = run_local_ranks(o.ranks, [&](Communicator& comm) -> Status {
      std::vector<char> send(largest, 1), recv(largest, 0);
      SP_ASSIGN_OR_RETURN(LinkSweep mine, sweep_links(comm, send.data(), recv.data(), o, log));
      if (comm.rank() == 0) sweep = std::move(mine);
      return Status::Ok();
    });
    SP_RETURN_IF_ERROR(status);
    m.comm_name = "local thread communicator";
    m.pair = sweep.pair;
    m.all_to_all_bytes_per_peer = sweep.all_to_all_bytes_per_peer, m.all_to_all_seconds = sweep.all_to_all_seconds;
    m.post_s = sweep.post_s, m.wait_s = sweep.wait_s;
    if (o.schedule_tokens > 0) {
      SP_RETURN_IF_ERROR(run_local_ranks(o.ranks, [&](Communicator& comm) -> Status {
        HostRankPasses passes(*cpu_backend_named(m.backend));
        SP_ASSIGN_OR_RETURN(std::vector<ScheduleSample> mine, sweep_schedules(comm, passes, o, log));
        if (comm.rank() == 0) m.schedules = std::move(mine);
        return Status::Ok();
      }));
    }
  } else {
    m.post_s = m.wait_s = m.launch_s;
    m.notes.push_back("post and wait: not measured (one rank): the launch time");
  }

  // GEMM: fp32 through the engine's BLAS (the CPU trainer's products).
#ifdef SEQPAR_HAVE_MODEL
  {
    const int n = int(o.gemm_size);
    std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
    log("probe: GEMM fp32 " + std::to_string(n) + "^3 ...");
    SP_ASSIGN_OR_RETURN(const double t, memory.median_seconds(
                                            [&] {
                                              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                                                          a.data(), n, b.data(), n, 0.0f, c.data(), n);
                                              return Status::Ok();
                                            },
                                            o.repeats));
    m.gemm_tflops = 2.0 * double(n) * n * n / t / 1e12;
    m.notes.push_back("gemm_tflops: an fp32 BLAS GEMM of " + std::to_string(n) + "^3 (the CPU has no bf16 path)");
  }
#else
  m.gemm_tflops = Cluster{}.gemm_tflops;
  m.notes.push_back("gemm_tflops: not measured (built without BLAS): the default");
#endif
  log("probe: GEMM " + std::to_string(m.gemm_tflops) + " TFLOP/s");

  // Memory bandwidth: a large memcpy, read and write counted, as Cluster::hbm_gbps counts them.
  {
    std::vector<char> from(size_t(o.copy_bytes), 1), to(size_t(o.copy_bytes), 0);
    SP_ASSIGN_OR_RETURN(const double t, memory.median_seconds(
                                            [&] {
                                              std::memcpy(to.data(), from.data(), from.size());
                                              return Status::Ok();
                                            },
                                            o.repeats));
    m.hbm_gbps = 2.0 * double(o.copy_bytes) / t / 1e9;
    log("probe: memory copy " + std::to_string(m.hbm_gbps) + " GB/s (read + write)");
  }
  // Thread ranks share the host's memory: each holds its share.
  m.memory_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE)) / o.ranks;
  return m;
}

}  // namespace seqpar::planner
