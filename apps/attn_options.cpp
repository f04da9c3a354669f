// `seqpar attn`'s options and their resolution into a job (attn_options.hpp). Everything that
// can be refused is refused here, before the ranks start and before anything large exists.
#include "attn_options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "attn_report.hpp"
#include "seqpar/algorithm.hpp"
#include "seqpar/gpu.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar::app {
namespace {

// Bytes of memory the system can still hand out (MemAvailable), or a very large number where
// it cannot be read.
double available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024.0;
    meminfo.ignore(256, '\n');
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 1e30;
}

// What the job will hold at its peak, from the shapes alone (doubles: a --seq of 10^14 must
// not overflow before it is refused). Host: every rank's shards of the nine tensors this
// process runs, the blocks its executor holds (about as much again on CPU ranks), the
// layout's positions, and on rank 0 the whole tensors and the oracle's fp64 copies when it
// checks or dumps. Device (GPU ranks): a rank's shards plus its workspace cap, per GPU.
struct MemoryEstimate {
  double host = 0, device_per_gpu = 0;
};
MemoryEstimate estimate_memory(const Job& job, int ranks_in_process, int ranks_per_gpu) {
  const AttnOptions& o = job.opt;
  const double S = double(o.seq), B = double(o.batch), H = double(o.heads), Hkv = double(job.kv_heads),
               D = double(o.head_dim), e = double(dtype_size(job.dtype));
  const double lse_e = job.on_gpu ? 4.0 : e;
  // q, dO, O, dQ and k, v, dK, dV, and the LSE, per token of the whole sequence.
  const double per_token = B * (4 * H * D + 4 * Hkv * D) * e + B * H * lse_e;
  const double share = double(ranks_in_process) / double(job.ranks);
  MemoryEstimate m;
  m.host = S * per_token * share * (job.on_gpu ? 1.0 : 2.0) + 16.0 * S;
  if (job.need_global) {
    m.host += S * per_token;  // the whole inputs and the gathered results, on rank 0
    if (job.check_mode != "none") m.host += S * B * (4 * H * D + 4 * Hkv * D + H) * 8.0;  // the oracle, fp64
    if (job.check_mode == "single") m.host += S * per_token;                               // the single-GPU result
  } else if (job.check_mode == "rows") {
    m.host += S * B * 2 * Hkv * D * (e + 8.0);  // every row of k and v, and their fp64 copies
  }
  if (job.on_gpu) {
    const double shard = std::ceil(S / job.ranks);
    const double q_shard = B * shard * H * D * e;
    const double workspace = std::min(16.0 * (1 << 30), std::max(256.0 * (1 << 20), 7.0 * q_shard));
    m.device_per_gpu = ranks_per_gpu * (shard * per_token + workspace);
  }
  return m;
}

Status check_fits_memory(const Job& job, int ranks_in_process) {
  const int ranks_per_gpu = job.launch == Launch::kSharedGpu ? job.ranks : 1;
  const MemoryEstimate need = estimate_memory(job, ranks_in_process, ranks_per_gpu);
  const double host = available_host_bytes();
  SP_CHECK_ARG(need.host <= host, "this problem needs about " + human_bytes(need.host) +
                                      " of host memory (inputs, results" +
                                      (job.need_global ? ", the whole tensors and the oracle on rank 0" : "") +
                                      "), and " + human_bytes(host) +
                                      " is available: lower --seq, --batch or --heads, use more processes "
                                      "(mpirun), or --check rows / none (or --ignore-memory-estimate, where "
                                      "memory grows as it is used)");
  if (job.on_gpu && (job.launch == Launch::kThreads || job.launch == Launch::kSharedGpu)) {
    const double free_bytes = double(cuda_free_memory());
    SP_CHECK_ARG(need.device_per_gpu <= free_bytes,
                 "each GPU needs about " + human_bytes(need.device_per_gpu) + " (" +
                     std::to_string(ranks_per_gpu) + " rank" + (ranks_per_gpu > 1 ? "s'" : "'s") +
                     " shards and workspace), and " + human_bytes(free_bytes) +
                     " is free: lower --seq or use more GPUs");
  }
  return Status::Ok();
}

// The --dump folder exists and takes a file, before any work is done.
Status check_dump_folder(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SP_CHECK_ARG(!ec, "--dump: cannot create the folder " + dir + ": " + ec.message());
  const std::string probe = dir + "/.seqpar_write_probe";
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  SP_CHECK_ARG(f != nullptr, "--dump: cannot write into " + dir);
  std::fclose(f);
  std::filesystem::remove(probe, ec);
  return Status::Ok();
}

}  // namespace

void add_attn_options(CLI::App& cmd, AttnOptions& o) {
  std::string algo_help = "one of";
  for (const Algorithm* a : all_algorithms()) algo_help += std::string("\n  ") + a->name + ": " + a->summary;
  algo_help += "\n  auto: the busiest rank does the least attention work, then sends the fewest bytes";
  cmd.add_option("--algo", o.algo, algo_help)->capture_default_str();
  cmd.add_option("--ulysses", o.ulysses,
                 "ulysses-ring: the Ulysses degree u (groups of u consecutive ranks, so nodes of a multiple of u "
                 "ranks keep the all-to-alls inside a node); 0: the largest the heads allow within a node")
      ->capture_default_str();
  cmd.add_option("--ring-algo", o.ring_algo,
                 "ulysses-ring: the ring-family algorithm across the Ulysses groups (ring, burst, ring-return, "
                 "burst-return, distflash, double-ring)")
      ->capture_default_str();
  cmd.add_flag("--keep-forward-state", o.keep_forward_state,
               "keep forward blocks for the backward instead of moving them again: ulysses, ulysses-ring keep "
               "the head-part Q and K/V (one more Q and K/V shard a rank; the backward's all-to-alls carry only "
               "dO and the row stats in); attention2d(-overlap) keep the swapped K/V (no K/V swap in the backward)");
  cmd.add_option("--ranks-per-node", o.ranks_per_node,
                 "ranks per node (the double ring's inner ring; bytes split intra/inter); 0: one node")
      ->capture_default_str();
  cmd.add_option("--print-schedule", o.print_schedule, "print this rank's steps (forward, backward) and exit");
  cmd.add_option("--layout", o.layout,
                 "sequence layout: contiguous, zigzag, striped, documents (balances the visible work of a docs mask)")
      ->capture_default_str();
  cmd.add_option("--mask", o.mask,
                 "full | causal | window:L,R | docs:N (causal inside N documents) | docs-lognormal:M[,SIGMA[,SEED]] "
                 "(documents of lognormal lengths, mean M tokens, log sd SIGMA, default 2) | "
                 "bigbird:W,G,R[,B=N] (block-sparse on N-token blocks, default 64: W window "
                 "blocks each side, G global, R random a row) | bigbird-causal:W,G,R[,B=N] | "
                 "blocks:PATH | blocks-causal:PATH (pattern file: 'block_size N', then one row "
                 "of 0/1 per query block)")
      ->capture_default_str();
  cmd.add_option("--seq", o.seq, "total sequence length (need not divide by the ranks)")->capture_default_str();
  cmd.add_option("--batch", o.batch, "batch size")->capture_default_str();
  cmd.add_option("--heads", o.heads, "query heads")->capture_default_str();
  cmd.add_option("--kv-heads", o.kv_heads, "key/value heads (GQA/MQA); default: --heads");
  cmd.add_option("--head-dim", o.head_dim, "head dimension")->capture_default_str();
  cmd.add_option("--ranks", o.ranks,
                 "ranks (threads); under mpirun: the process count; cuda: default all GPUs, and more "
                 "ranks than GPUs share GPU 0 (a thread and a stream each)")
      ->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "fp32 or fp64 on CPU (default fp32); bf16 or fp16 on cuda (default bf16)");
  cmd.add_option("--device", o.device,
                 "cpu, or cuda: one rank per GPU (a thread each; or processes under mpirun or "
                 "torchrun), NCCL between them")
      ->capture_default_str();
  cmd.add_option("--head-groups", o.head_groups,
                 "cuda: process the heads in this many groups (less workspace); default: the fewest "
                 "whose blocks fit in seven q shards and 16 GiB");
  cmd.add_option("--max-call-rows", o.max_call_rows,
                 "cuda: no cuDNN call spans more query or key rows than this (0: no limit); also the "
                 "single-GPU check's calls")
      ->capture_default_str();
  cmd.add_option("--threads-per-rank", o.threads_per_rank, "OpenMP threads per rank (default: cores / ranks)");
  cmd.add_option("--check", o.check,
                 "auto | full | sampled | rows | single | none: the fp64 oracle on every row or on "
                 "sampled rows (auto samples when the problem is large, and skips the check when too "
                 "large); rows: O, LSE and dQ of sampled query rows alone, at O(rows x S) cost, for "
                 "the largest runs; single (cuda): the whole problem on rank 0's GPU alone, every row")
      ->capture_default_str();
  cmd.add_option("--sample-rows", o.sample_rows, "query and key rows checked when sampling (at least 1)")
      ->capture_default_str();
  cmd.add_option("--seed", o.seed, "seed of the random inputs")->capture_default_str();
  cmd.add_flag("--json", o.json, "also print one JSON object with the results");
  cmd.add_flag("--ignore-memory-estimate", o.ignore_memory_estimate,
               "run even when the estimated memory exceeds what the system reports available (machines "
               "whose memory grows as it is used)");
  cmd.add_option("--dump", o.dump_dir, "write q, k, v, dO, O, LSE, dQ, dK, dV as .npy (global order)");
}

StatusOr<Job> resolve_job(const AttnOptions& opt, bool ranks_given, bool under_mpi, bool under_torchrun) {
  Job job;
  job.opt = opt;
  SP_CHECK_ARG(opt.algo == "auto" || find_algorithm(opt.algo),
               "unknown algorithm '" + opt.algo + "' (available: " + algorithm_names() + "|auto)");
  SP_CHECK_ARG(opt.ranks_per_node >= 0, "--ranks-per-node must be positive (0: one node)");
  SP_CHECK_ARG(opt.ulysses >= 0, "--ulysses must be positive (0: the largest the heads allow)");
  SP_CHECK_ARG(opt.device == "cpu" || opt.device == "cuda", "unknown device '" + opt.device + "' (available: cpu, cuda)");
  job.on_gpu = opt.device == "cuda";
  if (job.on_gpu) {
    SP_CHECK_SUPPORTED(nccl_available() && cuda_device_count() > 0,
                       cuda_device_count() == 0 ? "--device cuda: no CUDA GPU is visible"
                                                : "--device cuda: this build has no NCCL");
  }
  job.opt.dtype = opt.dtype.empty() ? (job.on_gpu ? "bf16" : "fp32") : opt.dtype;
  SP_ASSIGN_OR_RETURN(job.dtype, parse_dtype(job.opt.dtype));
  if (job.on_gpu)
    SP_CHECK_SUPPORTED(job.dtype == DType::kBF16 || job.dtype == DType::kF16,
                       "GPU ranks compute in bf16 or fp16, not " + job.opt.dtype);
  else
    SP_CHECK_SUPPORTED(job.dtype == DType::kF32 || job.dtype == DType::kF64,
                       "CPU ranks compute in fp32 or fp64; " + job.opt.dtype + " needs --device cuda");
  SP_CHECK_ARG(opt.batch >= 1 && opt.heads >= 1 && opt.head_dim >= 1 && opt.seq >= 1,
               "--batch, --heads, --head-dim and --seq must be positive");
  SP_CHECK_ARG(opt.kv_heads >= 0, "--kv-heads must be positive (0: as many as --heads)");
  job.kv_heads = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  SP_CHECK_ARG(opt.heads % job.kv_heads == 0, "--heads (" + std::to_string(opt.heads) +
                                                   ") must be divisible by --kv-heads (" +
                                                   std::to_string(job.kv_heads) + ")");
  SP_CHECK_ARG(opt.max_call_rows >= 0, "--max-call-rows must be 0 (no limit) or positive");
  SP_CHECK_ARG(opt.head_groups >= 0 && (opt.head_groups == 0 || job.kv_heads % opt.head_groups == 0),
               "--head-groups must divide the K/V heads (" + std::to_string(job.kv_heads) + ")");
  SP_CHECK_ARG(opt.check == "auto" || opt.check == "full" || opt.check == "sampled" || opt.check == "rows" ||
                   opt.check == "single" || opt.check == "none",
               "--check must be auto, full, sampled, rows, single or none");
  SP_CHECK_ARG(opt.check != "single" || job.on_gpu,
               "--check single compares with the single-GPU result: it needs --device cuda");
  SP_CHECK_ARG(opt.sample_rows >= 1, "--sample-rows must be at least 1; got " + std::to_string(opt.sample_rows));
  SP_CHECK_ARG(opt.threads_per_rank >= 0, "--threads-per-rank must be positive (0: cores / ranks)");
  SP_ASSIGN_OR_RETURN(const LayoutKind kind, parse_layout(opt.layout));

  if (under_mpi || under_torchrun) {
    const char* size = std::getenv(under_mpi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE");
    const int world = size ? std::atoi(size) : 0;
    SP_CHECK_ARG(!ranks_given || world == 0 || world == opt.ranks,
                 "--ranks " + std::to_string(opt.ranks) + " but the launcher started " + std::to_string(world) +
                     " processes; drop --ranks or make them agree");
    job.ranks = world > 0 ? world : opt.ranks;
    job.launch = under_mpi ? Launch::kMpi : Launch::kTorchrun;
    job.comm_backend = job.on_gpu ? (under_mpi ? "nccl, mpi processes" : "nccl, torchrun processes") : "mpi processes";
    SP_CHECK_SUPPORTED(job.on_gpu || under_mpi, "torchrun-style launches need --device cuda (NCCL)");
  } else if (job.on_gpu) {
    const int gpus = cuda_device_count();
    job.ranks = ranks_given ? opt.ranks : gpus;
    SP_CHECK_ARG(job.ranks >= 1 && job.ranks <= 64, "--ranks must be between 1 and 64 on GPUs");
    if (job.ranks <= gpus) {
      job.comm_backend = "nccl, a thread per GPU";
    } else {
      job.launch = Launch::kSharedGpu;
      job.comm_backend = "local, " + std::to_string(job.ranks) + " threads sharing GPU 0";
    }
  } else {
    SP_CHECK_ARG(opt.ranks >= 1 && opt.ranks <= 1024, "--ranks must be between 1 and 1024");
    job.ranks = opt.ranks;
    job.comm_backend = "local threads";
  }

  const double score_flops = double(opt.batch) * double(opt.heads) * double(opt.seq) * double(opt.seq) * double(opt.head_dim);
  job.check_mode = opt.check;
  if (job.check_mode == "auto")
    job.check_mode = score_flops <= kFullCheckLimit ? "full" : score_flops <= kSampledCheckLimit ? "sampled" : "none";
  job.need_global = (job.check_mode != "none" && job.check_mode != "rows") || !opt.dump_dir.empty();

  const char* local_size = std::getenv(under_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "LOCAL_WORLD_SIZE");
  const int ranks_here =
      (under_mpi || under_torchrun) && local_size ? std::max(1, std::atoi(local_size)) : job.ranks;
  // Before the layout and the mask, which allocate per token.
  if (!opt.ignore_memory_estimate) SP_RETURN_IF_ERROR(check_fits_memory(job, under_mpi || under_torchrun ? 1 : job.ranks));
  SP_ASSIGN_OR_RETURN(job.mask, parse_mask(opt.mask, opt.seq));
  SP_RETURN_IF_ERROR(Layout::create(kind, opt.seq, job.ranks, job.mask.doc_offsets).status());
  if (!opt.dump_dir.empty()) SP_RETURN_IF_ERROR(check_dump_folder(opt.dump_dir));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  job.threads_per_rank = opt.threads_per_rank > 0 ? opt.threads_per_rank : std::max(1, cores / ranks_here);
  return job;
}

}  // namespace seqpar::app
