// The communicator interface every distributed schedule talks to, and its byte accounting.
// Implementations: `local` (ranks are threads of one process) and `mpi` (Open MPI processes);
// NCCL follows the same interface. Collectives are ring algorithms over batched point-to-point
// steps (src/comm/collectives.cpp), except where a backend runs them natively on device buffers
// (NCCL); either way they count the bytes the ring sends, so counters compare across backends.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "seqpar/dtype.hpp"
#include "seqpar/status.hpp"

namespace seqpar {

// Counters are kept per phase so a schedule's forward and backward traffic can be checked
// separately against the paper formulas.
enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOther = 2 };
inline constexpr int kNumPhases = 3;
const char* phase_name(Phase phase);

struct CommCounters {
  std::array<int64_t, kNumPhases> bytes_sent{};
  std::array<int64_t, kNumPhases> bytes_received{};
  // Bytes sent to each peer rank (index: the peer's rank in this communicator), per phase: the
  // measured split by link class (intra-node, inter-node) is summed from it.
  std::vector<std::array<int64_t, kNumPhases>> sent_to;
  int64_t sent(Phase p) const { return bytes_sent[static_cast<int>(p)]; }
  int64_t received(Phase p) const { return bytes_received[static_cast<int>(p)]; }
};

struct SendSpec {
  int peer;
  const void* data;
  size_t bytes;
};
struct RecvSpec {
  int peer;
  void* data;
  size_t bytes;
};

enum class ReduceOp : uint8_t { kSum, kMax };

// A collective that a backend may run natively (NCCL on device buffers); see
// Communicator::post_collective.
enum class CollectiveKind : uint8_t { kAllGather, kReduceScatter, kAllReduce };
struct CollectiveSpec {
  CollectiveKind kind;
  const void* send;  // all_reduce: == recv (in place)
  void* recv;
  size_t count;      // all_gather: bytes per rank; reduce_scatter: elements per rank; all_reduce: elements
  DType dtype;       // reduce_scatter, all_reduce
  ReduceOp op;       // reduce_scatter, all_reduce
};

// A batch of sends and receives in flight; wait() completes all of them. Buffers must stay
// valid (and sends unmodified) until wait() returns. Destroying it waits too.
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  [[nodiscard]] virtual Status wait() = 0;
  // Makes later work queued on the CUDA stream `stream` wait for this batch. Stream-ordered
  // backends (NCCL) do this without blocking the host; the others complete it first.
  [[nodiscard]] virtual Status wait_on_stream(void* stream) {
    (void)stream;
    return wait();
  }
};

class DeviceBuffer;

// Where a call on device buffers is ordered: after the work queued so far on a CUDA stream (`on`;
// nullptr is the legacy default stream, a valid stream), and work queued there later sees its
// result. A call given none (StreamOrder{}) starts at once and, on device buffers, completes
// before returning: the caller synchronises its stream first. Host buffers ignore it.
struct StreamOrder {
  void* stream = nullptr;
  bool set = false;
  static StreamOrder on(void* s) { return {s, true}; }
};

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();  // out of line: DeviceBuffer is complete only there

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // Posts every send and receive of the batch, then completes them all. Never deadlocks when
  // all ranks post matching batches, including P = 2 where previous and next are the same
  // peer (messages between a pair are matched in posting order).
  [[nodiscard]] Status exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs);
  // Starts the batch and returns at once where the backend can progress it in the background
  // (the overlap used by the schedules); otherwise it completes before returning. Device
  // buffers: stream-ordered backends start it after the work queued on `order`'s stream;
  // host-driven ones start it at once (see stream_ordered()).
  [[nodiscard]] StatusOr<std::unique_ptr<PendingExchange>> start_exchange(
      std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, StreamOrder order = {});

  // Collectives. Buffers are all on the host or all on the device (device buffers need
  // moves_device_buffers(); the others take every buffer for host memory). Bytes are counted as the ring sends them, to the next rank, on
  // every backend. On device buffers a collective is ordered after the work queued on
  // `order`'s stream and work queued there later sees its result: stream-ordered backends
  // (NCCL) do this without blocking the host (native NCCL collectives); host-driven ones
  // synchronise that stream first and return when done (ring over exchange, reductions by a
  // CUDA kernel). With no stream, the caller synchronises before and the call completes before
  // returning. Host buffers always complete before returning.
  // all_gather: send [n] from each rank into recv [P * n] in rank order; sends (P-1) n.
  [[nodiscard]] Status all_gather(const void* send, void* recv, size_t bytes_per_rank, StreamOrder order = {});
  // reduce_scatter: send [P * count] -> recv [count] = reduction of block `rank` over ranks;
  // sends (P-1) count elements. f64, f32, bf16, f16 (these two reduce through float).
  [[nodiscard]] Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                      ReduceOp op, StreamOrder order = {});
  // all_to_all: block r of send [P * n] goes to rank r; recv block r came from rank r. One
  // batch of point-to-point (all_to_all_v with equal splits); sends (P-1) n.
  [[nodiscard]] Status all_to_all(const void* send, void* recv, size_t bytes_per_rank, StreamOrder order = {});
  // all_to_all_v: uneven splits, one batch of point-to-point. send_bytes[q] bytes at
  // send + send_offsets[q] go to rank q; recv_bytes[q] bytes from rank q land at
  // recv + recv_offsets[q] (every span has P entries; send_bytes[q] on this rank must equal
  // recv_bytes[r] on rank q). Zero-size pieces send nothing; the piece for this rank is copied
  // locally and not counted. Buffers may be null where all their pieces are empty.
  [[nodiscard]] Status all_to_all_v(const void* send, std::span<const size_t> send_bytes,
                                    std::span<const size_t> send_offsets, void* recv,
                                    std::span<const size_t> recv_bytes,
                                    std::span<const size_t> recv_offsets, StreamOrder order = {});
  // all_reduce in place over [count] elements (reduce-scatter + all-gather over P chunks of
  // ceil(count / P), padded); sends 2 (P-1) ceil(count / P) elements.
  [[nodiscard]] Status all_reduce(void* data, size_t count, DType dtype, ReduceOp op, StreamOrder order = {});
  [[nodiscard]] virtual Status barrier();
  // Ranks with the same color form a sub-communicator, ordered by (key, rank). Collective.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Communicator>> split(int color, int key) = 0;
  // Makes every rank's pending and future calls fail (local) or ends the job (MPI): used when
  // this rank cannot go on, so the others exit with an error instead of waiting forever.
  virtual void abort(const std::string& reason) = 0;

  // ---- device buffers ----
  // Stream-ordered backends (NCCL) start a batch after the work already queued on the call's
  // StreamOrder stream, on a stream of their own. Host-driven backends (local, mpi) start it at
  // once: the caller synchronises its stream before posting device buffers.
  virtual bool stream_ordered() const { return false; }
  // Whether device buffers may be sent and received (NCCL; the local communicator copies them
  // between ranks sharing a GPU); MPI here moves host memory only.
  virtual bool moves_device_buffers() const { return stream_ordered(); }
  // Blocks the host until the work queued on `stream` is done. Stream-ordered backends keep
  // watching for a failed or stalled peer meanwhile (the timeout counts from the last
  // progress) and abort instead of hanging.
  [[nodiscard]] virtual Status synchronize(void* stream);

  void set_phase(Phase phase) { phase_ = phase; }
  Phase phase() const { return phase_; }
  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 protected:
  // The ordering stream of the call in progress (its StreamOrder), for the backends' hooks.
  bool has_stream() const { return has_stream_; }
  void* stream() const { return stream_; }
  void set_stream(void* stream) { stream_ = stream, has_stream_ = true; }
  void clear_stream() { stream_ = nullptr, has_stream_ = false; }
  // A public call's StreamOrder for its duration; a call given none keeps the enclosing call's.
  class OrderScope {
   public:
    OrderScope(Communicator& c, StreamOrder order) : c_(c), saved_{c.stream_, c.has_stream_} {
      if (order.set) c.set_stream(order.stream);
    }
    ~OrderScope() { c_.stream_ = saved_.stream, c_.has_stream_ = saved_.set; }

   private:
    Communicator& c_;
    StreamOrder saved_;
  };

  // Backend hooks. `post` starts the batch and returns its handle.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<PendingExchange>> post(
      std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) = 0;
  // Whether `post` really progresses in the background (else start_exchange completes it).
  virtual bool overlaps() const = 0;
  // Runs a collective on device buffers natively, stream-ordered like `post` (bytes are
  // counted by the caller); a null handle means "not native here: use the ring".
  [[nodiscard]] virtual StatusOr<std::unique_ptr<PendingExchange>> post_collective(
      const CollectiveSpec& spec) {
    (void)spec;
    return std::unique_ptr<PendingExchange>();
  }

 private:
  Status check_specs(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) const;
  void count(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs);
  // Bytes of one ring collective: `sent` to the next rank, `received` from the previous.
  void count_ring(size_t sent, size_t received);
  // Device collectives (collectives.cpp): the native one where the backend has it, else the
  // ring; the stream handling described at all_gather.
  Status run_device_collective(const CollectiveSpec& spec);
  Status finish_on_stream(StatusOr<std::unique_ptr<PendingExchange>> started);
  Status settle_stream_for_host_driven();
  Status ring_all_gather(void* recv, size_t n);
  Status ring_reduce_scatter(char* acc, char* incoming, size_t count, DType dtype, ReduceOp op,
                             bool on_device);
  Status ring_all_reduce(void* data, size_t count, DType dtype, ReduceOp op, bool on_device);
  Status copy_local(void* dst, const void* src, size_t bytes, bool on_device);
  Status reserve_device_scratch(size_t bytes);

  Phase phase_ = Phase::kOther;
  CommCounters counters_;
  void* stream_ = nullptr;
  bool has_stream_ = false;
  // The device ring's work space (partial sums, padding), kept between calls.
  std::unique_ptr<DeviceBuffer> device_scratch_;
};

// Sets the phase for a scope and restores the previous one.
class PhaseScope {
 public:
  PhaseScope(Communicator& comm, Phase phase) : comm_(comm), saved_(comm.phase()) {
    comm.set_phase(phase);
  }
  ~PhaseScope() { comm_.set_phase(saved_); }

 private:
  Communicator& comm_;
  Phase saved_;
};

// ---- local: ranks as threads in one process --------------------------------------------

// Shared state of one group of in-process ranks.
class LocalWorld;

// Creates `size` communicators that talk to each other; hand one to each thread.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size);

// Runs fn(comm) on `size` threads, one per rank, and returns the first non-ok Status.
// A rank that fails aborts the world so the others return errors instead of waiting forever.
Status run_local_ranks(int size, const std::function<Status(Communicator&)>& fn);

// How long a rank waits for a peer before giving up: SEQPAR_COMM_TIMEOUT_S (default 300 s),
// read at each call.
std::chrono::milliseconds comm_timeout();

// The first failure among the ranks' results, preferring a root cause over the
// "communicator aborted" errors it caused in the other ranks; Ok when all succeeded.
Status first_root_cause(const std::vector<Status>& results);

// ---- mpi --------------------------------------------------------------------------------

// True when this process was started by mpirun/mpiexec (Open MPI or PMI environment).
bool launched_by_mpi();
// True when torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) are set.
bool launched_by_torchrun();
// MPI_COMM_WORLD (initialising MPI once, finalised at exit); kUnsupported without MPI.
StatusOr<std::unique_ptr<Communicator>> make_mpi_world_communicator();

// ---- tcp: processes over TCP connections (CPU ranks under torchrun) ---------------------

// Where a tcp world meets: rank 0 serves the bootstrap on `port` at listen_host (empty:
// master_addr; "*": every interface) and the others reach it at master_addr; only ranks with the
// same token are let in.
struct TcpWorld {
  std::string master_addr;
  int port = 0;
  std::string listen_host;
  std::string token;
  int rank = 0, world = 1;
};
// A full mesh of TCP connections among the world's processes (host buffers only; batches
// complete before returning, no overlap). Collective: every rank of the world calls it.
StatusOr<std::unique_ptr<Communicator>> make_tcp_communicator(const TcpWorld& world);
// The world of a torchrun job, from its environment (RANK, WORLD_SIZE, MASTER_ADDR, the port
// of the bootstrap: SEQPAR_BOOTSTRAP_PORT, else MASTER_PORT + 1, and the job token).
StatusOr<std::unique_ptr<Communicator>> make_tcp_world_communicator();
}  // namespace seqpar
