// `seqpar probe` on GPUs: launch and synchronisation overheads (empty kernels), a bf16 cuBLAS
// GEMM, a device-to-device copy, free memory, the GPU attention backends on GPU 0 (bf16 inputs,
// fp32 accumulators, timed with CUDA events), and the links between GPUs over NCCL, a thread per
// GPU. Each step logs a line before it starts, so a failing step is visible.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <memory>

#include "core/cuda_check.hpp"
#include "planner/probe.hpp"
#include "planner/probe_sweeps.hpp"
#include "parallel/gpu_executor.hpp"
#include "seqpar/backend.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar::planner {
namespace {

__global__ void empty_kernel() {}

// Uniform values in [-1, 1) from a hash of the index (splitmix64): the same on every run.
__global__ void fill_uniform(void* data, DType dtype, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float u = float(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (dtype == DType::kF32) static_cast<float*>(data)[i] = u;
    else if (dtype == DType::kBF16) static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(u);
    else static_cast<__half*>(data)[i] = __float2half(u);
  }
}

// Two events, destroyed however the timing ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

class DeviceProbeMemory final : public ProbeMemory {
 public:
  StatusOr<TensorView> random(DType dtype, const std::vector<int64_t>& shape) override {
    SP_CHECK_ARG(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                 std::string("probe: no random fill for ") + dtype_name(dtype));
    SP_ASSIGN_OR_RETURN(DeviceTensor t, device_zeros(dtype, shape));
    const int64_t n = t.view.numel();
    const int blocks = int(std::min<int64_t>((n + 255) / 256, 4096));
    if (n > 0) fill_uniform<<<blocks, 256>>>(t.view.data, dtype, n, ++seed_ * 0x2545F4914F6CDD1Dull);
    SP_CUDA_CHECK(cudaGetLastError());
    tensors_.push_back(std::move(t));
    return tensors_.back().view;
  }
  void release() override {
    cudaDeviceSynchronize();  // nothing queued may still use what is freed
    tensors_.clear();
  }
  StatusOr<double> median_seconds(const std::function<Status()>& call, int repeats) override {
    SP_RETURN_IF_ERROR(call());  // untimed: cuDNN graphs built, plans cached
    SP_CUDA_CHECK(cudaDeviceSynchronize());
    EventPair events;
    SP_CUDA_CHECK(cudaEventCreate(&events.start));
    SP_CUDA_CHECK(cudaEventCreate(&events.stop));
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      SP_CUDA_CHECK(cudaEventRecord(events.start, nullptr));
      SP_RETURN_IF_ERROR(call());
      SP_CUDA_CHECK(cudaEventRecord(events.stop, nullptr));
      SP_CUDA_CHECK(cudaEventSynchronize(events.stop));
      float ms = 0;
      SP_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
      times.push_back(double(ms) * 1e-3);
    }
    return median(times);
  }
  // device_memory_stats counts what DeviceBuffers and the stream arenas hold: the backends'
  // workspaces come from the arenas, which keep their segments after a call (so a first call's
  // peak shows even when the memory is reused later), and the schedules' memory is counted the
  // same way by the benchmarks this figure is checked against.
  StatusOr<int64_t> workspace_bytes(const std::function<Status()>& call) override {
    SP_CUDA_CHECK(cudaDeviceSynchronize());
    SP_RETURN_IF_ERROR(trim_stream_arenas());  // segments kept from earlier calls would hide this one's
    int device = 0;
    SP_CUDA_CHECK(cudaGetDevice(&device));
    const int64_t before = device_memory_stats(device).current;
    reset_device_memory_peak(device);
    SP_RETURN_IF_ERROR(call());
    SP_CUDA_CHECK(cudaDeviceSynchronize());
    return std::max<int64_t>(0, device_memory_stats(device).peak - before);
  }

 private:
  std::vector<DeviceTensor> tensors_;
  uint64_t seed_ = 0;
};

std::string figure(const char* fmt, double value) {
  char text[96];
  std::snprintf(text, sizeof text, fmt, value);
  return text;
}

// Host launch cost of an empty kernel (many queued back to back), and the host's wait for a
// stream whose last kernel is just finishing.
Status measure_launch_and_wait(ProbeMeasurements& m, const ProbeLog& log) {
  log("probe: launch and wait ...");
  empty_kernel<<<1, 1>>>();
  SP_CUDA_CHECK(cudaGetLastError());
  SP_CUDA_CHECK(cudaDeviceSynchronize());
  constexpr int kLaunches = 2000;
  cudaError_t synced = cudaSuccess;
  const double t = host_seconds([&] {
    for (int i = 0; i < kLaunches; ++i) empty_kernel<<<1, 1>>>();
    synced = cudaStreamSynchronize(nullptr);
  });
  SP_CUDA_CHECK(synced);
  SP_CUDA_CHECK(cudaGetLastError());
  m.launch_s = t / kLaunches;
  std::vector<double> waits;
  for (int i = 0; i < 100; ++i) {
    empty_kernel<<<1, 1>>>();
    waits.push_back(host_seconds([&] { synced = cudaStreamSynchronize(nullptr); }));
    SP_CUDA_CHECK(synced);
  }
  SP_CUDA_CHECK(cudaGetLastError());
  m.wait_s = median(waits);
  log("probe: launch" + figure(" %.3g us a kernel", m.launch_s * 1e6) + figure(", wait %.3g us", m.wait_s * 1e6));
  return Status::Ok();
}

// A square bf16 GEMM through cuBLAS, fp32 accumulation, as the model's products run (linear.cu).
Status measure_gemm(ProbeMeasurements& m, DeviceProbeMemory& memory, const ProbeOptions& o, const ProbeLog& log) {
  const int64_t n = o.gemm_size;
  log("probe: GEMM bf16 " + std::to_string(n) + "^3 ...");
  SP_ASSIGN_OR_RETURN(const TensorView a, memory.random(DType::kBF16, {n, n}));
  SP_ASSIGN_OR_RETURN(const TensorView b, memory.random(DType::kBF16, {n, n}));
  SP_ASSIGN_OR_RETURN(const TensorView c, memory.random(DType::kBF16, {n, n}));
  cublasHandle_t handle = nullptr;
  SP_CHECK_SUPPORTED(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "probe: cannot create a cuBLAS handle");
  const std::unique_ptr<cublasContext, decltype(&cublasDestroy)> owner(handle, &cublasDestroy);
  const float alpha = 1.0f, beta = 0.0f;
  const auto gemm = [&]() -> Status {
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, a.data,
                                          CUDA_R_16BF, int(n), b.data, CUDA_R_16BF, int(n), &beta, c.data, CUDA_R_16BF,
                                          int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    SP_CHECK_SUPPORTED(s == CUBLAS_STATUS_SUCCESS, std::string("cublasGemmEx: ") + cublasGetStatusString(s));
    return Status::Ok();
  };
  SP_ASSIGN_OR_RETURN(const double t, memory.median_seconds(gemm, o.repeats));
  memory.release();
  m.gemm_tflops = 2.0 * double(n) * double(n) * double(n) / t / 1e12;
  log("probe: GEMM" + figure(" %.4g TFLOP/s", m.gemm_tflops));
  return Status::Ok();
}

// A device-to-device copy, read and write counted (Cluster::hbm_gbps).
Status measure_copy(ProbeMeasurements& m, DeviceProbeMemory& memory, const ProbeOptions& o, const ProbeLog& log) {
  log("probe: memory copy " + std::to_string(o.copy_bytes) + " bytes ...");
  const int64_t n = o.copy_bytes / 4;
  SP_ASSIGN_OR_RETURN(const TensorView from, memory.random(DType::kF32, {n}));
  SP_ASSIGN_OR_RETURN(const TensorView to, memory.random(DType::kF32, {n}));
  SP_ASSIGN_OR_RETURN(const double t, memory.median_seconds(
                                          [&]() -> Status {
                                            SP_CUDA_CHECK(cudaMemcpyAsync(to.data, from.data, size_t(n) * 4,
                                                                          cudaMemcpyDeviceToDevice, nullptr));
                                            return Status::Ok();
                                          },
                                          o.repeats));
  memory.release();
  m.hbm_gbps = 2.0 * double(n) * 4 / t / 1e9;
  log("probe: memory copy" + figure(" %.4g GB/s (read + write)", m.hbm_gbps));
  return Status::Ok();
}

// A GPU rank's distributed passes (bf16 inputs, the backend a session picks) through the GPU
// executor, on a stream of its own so the communicator's stream overlaps it as in a run.
class DeviceRankPasses final : public ProbeRankPasses {
 public:
  // `backend`: the one whose rows price the computes (ProbeMeasurements::backend).
  explicit DeviceRankPasses(std::string backend) : backend_name_(std::move(backend)) {}
  ~DeviceRankPasses() override { release(); }
  Status prepare(Communicator& comm, const std::string& algorithm, const Layout& layout,
                 const ProbeOptions& o) override {
    SP_ASSIGN_OR_RETURN(t_, random_shard_tensors(memory_, DType::kBF16, layout.local_len(comm.rank()), o));
    SP_CUDA_CHECK(cudaDeviceSynchronize());  // the fills ran on the default stream
    AttentionParams params;
    params.mask = MaskSpec::causal();
    backend_ = make_gpu_backend_named(backend_name_, t_.q.device.index);
    SP_CHECK_SUPPORTED(backend_ != nullptr, "probe: no GPU backend '" + backend_name_ + "' for the timed pass");
    PlanOptions plan_options(algorithm);
    plan_options.head_groups = 1;
    SP_ASSIGN_OR_RETURN(AttentionPlan plan, plan_attention(plan_options, layout, params,
                                                           block_bytes_for(t_.q, t_.k, *backend_), comm.rank(),
                                                           *backend_));
    plan_ = std::make_unique<AttentionPlan>(std::move(plan));
    SP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return Status::Ok();
  }
  Status run(Communicator& comm, Pass pass) override {
    SP_RETURN_IF_ERROR(pass == Pass::kForward ? run_forward_gpu(comm, *plan_, t_, ws_, stream_)
                                              : run_backward_gpu(comm, *plan_, t_, ws_, stream_));
    return comm.synchronize(stream_);  // gives up, rather than hangs, where a peer failed
  }
  const AttentionPlan& plan() const override { return *plan_; }
  void release() override {
    if (stream_ && !device_abandoned()) {
      cudaStreamSynchronize(stream_);
      (void)forget_stream_arenas(stream_);  // the executor's blocks go back to the device
      cudaStreamDestroy(stream_);
    }
    stream_ = nullptr;
    plan_.reset(), backend_.reset();
    memory_.release();
  }

 private:
  std::string backend_name_;
  DeviceProbeMemory memory_;
  ShardTensors t_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<AttentionPlan> plan_;
  GpuWorkspace ws_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

StatusOr<ProbeMeasurements> measure_cuda(const ProbeOptions& o, const ProbeLog& log) {
  const int visible = cuda_device_count();
  SP_CHECK_SUPPORTED(visible > 0, "--device cuda: no CUDA device is visible");
  SP_CHECK_ARG(o.ranks <= visible, "--gpus " + std::to_string(o.ranks) + ": only " + std::to_string(visible) +
                                       " GPU(s) are visible");
  SP_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  SP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  ProbeMeasurements m;
  m.device_name = prop.name;
  m.ranks = o.ranks;
  m.memory_bytes = cuda_free_memory();  // before the probe takes any: what a run may use
  const std::string by = "seqpar probe on " + m.device_name;
  log("probe: " + m.device_name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + "), " +
      std::to_string(o.ranks) + " GPU(s), " + figure("%.1f GiB free", double(m.memory_bytes) / (1 << 30)));

  DeviceProbeMemory memory;
  SP_RETURN_IF_ERROR(measure_launch_and_wait(m, log));
  SP_RETURN_IF_ERROR(measure_gemm(m, memory, o, log));
  SP_RETURN_IF_ERROR(measure_copy(m, memory, o, log));

  // Attention on GPU 0: the backend a session would pick for a causal call of this shape first
  // (its rows price the computes), then any others asked for.
  std::vector<std::string> backends = o.backends;
  if (backends.empty()) {
    SP_ASSIGN_OR_RETURN(const TensorView q, memory.random(DType::kBF16, {1, o.tokens.front(), o.heads, o.head_dim}));
    AttentionParams causal;
    causal.mask = MaskSpec::causal();
    const std::unique_ptr<AttentionBackend> chosen = make_gpu_backend(q, causal);
    SP_CHECK_SUPPORTED(chosen != nullptr, "probe: this build has no GPU attention backend");
    backends.push_back(chosen->name());
    memory.release();
  }
  m.backend = backends.front();
  for (const std::string& name : backends) {
    const std::unique_ptr<AttentionBackend> backend = make_gpu_backend_named(name, 0);
    SP_CHECK_ARG(backend != nullptr, "--backends: '" + name +
                                         "' is not a GPU backend of this build and device (cudnn, hopper, cuda, auto)");
    SP_ASSIGN_OR_RETURN(const AttentionSweep sweep, sweep_attention(*backend, DType::kBF16, memory, o, by + ", bf16", log));
    m.attention.insert(m.attention.end(), sweep.rows.begin(), sweep.rows.end());
    if (name == m.backend) {
      m.call_workspace_bytes_per_query_element = sweep.call_workspace_bytes_per_query_element;
      m.workspace_tokens = sweep.workspace_tokens;
    }
  }

  // Links: a rank per GPU over NCCL, device buffers.
  if (o.ranks >= 2) {
    SP_CHECK_SUPPORTED(nccl_available(), "--gpus " + std::to_string(o.ranks) + ": this build has no NCCL");
    const size_t largest = size_t(o.message_bytes.back());
    LinkSweep sweep;
    SP_RETURN_IF_ERROR(run_nccl_local_ranks(o.ranks, [&](Communicator& comm) -> Status {
      SP_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::allocate(largest));
      SP_ASSIGN_OR_RETURN(DeviceBuffer recv, DeviceBuffer::allocate(largest));
      SP_ASSIGN_OR_RETURN(LinkSweep mine, sweep_links(comm, send.data(), recv.data(), o, log));
      if (comm.rank() == 0) sweep = std::move(mine);
      return Status::Ok();
    }));
    m.comm_name = "NCCL";
    m.pair = sweep.pair;
    m.all_to_all_bytes_per_peer = sweep.all_to_all_bytes_per_peer, m.all_to_all_seconds = sweep.all_to_all_seconds;
    m.post_s = sweep.post_s;
    if (o.schedule_tokens > 0) {
      SP_RETURN_IF_ERROR(run_nccl_local_ranks(o.ranks, [&](Communicator& comm) -> Status {
        DeviceRankPasses passes(m.backend);
        SP_ASSIGN_OR_RETURN(std::vector<ScheduleSample> mine, sweep_schedules(comm, passes, o, log));
        if (comm.rank() == 0) m.schedules = std::move(mine);
        return Status::Ok();
      }));
    }
  } else {
    m.post_s = m.launch_s;
    m.notes.push_back("post: not measured (one GPU): the launch time");
  }
  return m;
}

}  // namespace seqpar::planner
