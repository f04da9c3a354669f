// Communicators on GPUs. NCCL between GPUs of one process (a thread per rank): a failing rank
// makes the others fail instead of hang, and the host collectives and splits work (skipped
// below two GPUs). Device collectives (all_gather, reduce_scatter, all_reduce, all_to_all_v),
// ordered on the caller's stream, against the host collectives on the same data, with the same
// counted bytes: on thread ranks sharing one GPU (local communicator) and on NCCL (native
// collectives; the world and a split).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "seqpar/gpu.hpp"
#include "seqpar/nccl_comm.hpp"

namespace seqpar {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Two fresh streams on the current device, and the device's bytes once the arenas are trimmed
// (base); at the end each stream's arena is forgotten and the stream destroyed, unless end()
// ended it before.
struct TwoStreams {
  int device = 0;
  int64_t base = 0;
  cudaStream_t s = nullptr, other = nullptr;
  void start() {
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    ASSERT_TRUE(trim_stream_arenas().ok());
    base = device_memory_stats(device).current;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  }
  static void end(cudaStream_t& x) {
    if (!x) return;
    EXPECT_TRUE(forget_stream_arenas(x).ok());
    EXPECT_EQ(cudaStreamDestroy(x), cudaSuccess);
    x = nullptr;
  }
  ~TwoStreams() { end(s), end(other); }
};

// Stream buffers: a block given back on its stream serves the next ones taken there (split, or
// joined with its free neighbour) without more memory; one given back on another stream serves
// them once that stream is past it; a free block at the end joins the memory mapped after it;
// the arena's memory is counted in the device's, and a trim hands it back.
TEST(StreamBuffer, ReusesWhatWasGivenBackAndCountsWhatItHolds) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  TwoStreams streams;
  ASSERT_NO_FATAL_FAILURE(streams.start());
  const int device = streams.device;
  const int64_t base = streams.base;
  const cudaStream_t s = streams.s, other = streams.other;
  const auto take = [&](size_t bytes) {
    auto b = StreamBuffer::allocate(bytes, s);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(cudaMemsetAsync(b->data(), 1, bytes, s), cudaSuccess);
    return std::move(b).value();
  };
  {
    StreamBuffer a = take(64 * kMiB);
    const int64_t held = device_memory_stats(device).current;
    EXPECT_EQ(held - base, int64_t(64 * kMiB));
    a.release(s);
    StreamBuffer b = take(32 * kMiB), c = take(32 * kMiB);  // two halves of a's memory
    EXPECT_EQ(device_memory_stats(device).current, held);
    b.release(s), c.release(s);
    StreamBuffer d = take(64 * kMiB);  // the halves joined again
    EXPECT_EQ(device_memory_stats(device).current, held);
    StreamBuffer e = take(64 * kMiB);  // while d is held: more memory
    EXPECT_EQ(device_memory_stats(device).current - held, int64_t(64 * kMiB));
    ASSERT_EQ(cudaMemsetAsync(e.data(), 2, 64 * kMiB, other), cudaSuccess);
    e.release(other);
    ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    StreamBuffer f = take(64 * kMiB);  // e's memory, the other stream being past it
    EXPECT_EQ(device_memory_stats(device).current - held, int64_t(64 * kMiB));
    f.release(s);
    StreamBuffer g = take(96 * kMiB);  // f's memory at the end, and 32 MiB mapped after it
    EXPECT_EQ(device_memory_stats(device).current - held, int64_t(96 * kMiB));
  }  // d and g go back on s
  ASSERT_TRUE(trim_stream_arenas().ok());
  EXPECT_EQ(device_memory_stats(device).current, base);
}

// A block given back on another stream waits for that stream: while it is held up, the next
// block taken on the arena's stream gets other memory. An ending stream's arena goes back to
// CUDA once its last block does, even a block that outlives the stream.
TEST(StreamBuffer, WaitsForTheStreamItWasGivenBackOnAndEndsWithItsStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  TwoStreams streams;
  ASSERT_NO_FATAL_FAILURE(streams.start());
  const int device = streams.device;
  const int64_t base = streams.base;
  const cudaStream_t s = streams.s, other = streams.other;
  static std::atomic<bool> go;  // static: `other` may still read it after a failed assertion returns
  go = false;
  struct Release {
    ~Release() { go = true; }
  } release_on_return;
  const auto hold_until_go = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  {
    auto a = StreamBuffer::allocate(8 * kMiB, s);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    void* const first = a->data();
    ASSERT_EQ(cudaLaunchHostFunc(other, hold_until_go, &go), cudaSuccess);  // `other` stops here
    ASSERT_EQ(cudaMemsetAsync(first, 3, 8 * kMiB, other), cudaSuccess);
    a->release(other);
    auto b = StreamBuffer::allocate(8 * kMiB, s);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->data(), first) << "a block still in use on another stream was handed out again";
    go = true;
    ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    b->release(s);
    auto c = StreamBuffer::allocate(16 * kMiB, s);  // both, joined, now that `other` is past a
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(device_memory_stats(device).current - base, int64_t(16 * kMiB));
  }
  ASSERT_GT(device_memory_stats(device).current, base);  // kept for the stream's next blocks
  auto outliving = StreamBuffer::allocate(4 * kMiB, s);
  ASSERT_TRUE(outliving.ok());
  TwoStreams::end(streams.s);
  EXPECT_GT(device_memory_stats(device).current, base);  // the outliving block's memory stays
  outliving->release(s);  // the stream it was taken on, ended
  EXPECT_EQ(device_memory_stats(device).current, base);
}

// A rank that fails makes the others return an error instead of waiting for it.
TEST(NcclCommunicator, FailingRankAbortsTheOthers) {
  if (cuda_device_count() < 2 || !nccl_available()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    if (comm.rank() == 1) return SP_STATUS(StatusCode::kInternal, "rank 1 gives up");
    auto buf = DeviceBuffer::allocate(1 << 20);
    if (!buf.ok()) return buf.status();
    auto other = DeviceBuffer::allocate(1 << 20);
    if (!other.ok()) return other.status();
    const SendSpec send{1, buf->data(), 1 << 20};
    const RecvSpec recv{1, other->data(), 1 << 20};
    return comm.exchange({&send, 1}, {&recv, 1});  // rank 1 never posts
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 gives up"), std::string::npos) << s.message();
}

TEST(NcclCommunicator, HostCollectives) {
  if (cuda_device_count() < 2 || !nccl_available()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const Status s = run_nccl_local_ranks(2, [](Communicator& comm) -> Status {
    double x[2] = {1.0 + comm.rank(), 10.0 * comm.rank()};
    SP_RETURN_IF_ERROR(comm.all_reduce(x, 2, DType::kF64, ReduceOp::kSum));
    SP_CHECK_ARG(x[0] == 3.0 && x[1] == 10.0, "all_reduce gave " + std::to_string(x[0]));
    // Splits are cached per (color, key): both views talk through one NCCL communicator.
    for (int again = 0; again < 2; ++again) {
      SP_ASSIGN_OR_RETURN(auto alone, comm.split(comm.rank(), 0));
      SP_CHECK_ARG(alone->size() == 1 && alone->rank() == 0, "a split of one rank");
      SP_ASSIGN_OR_RETURN(auto both, comm.split(0, -comm.rank()));
      SP_CHECK_ARG(both->size() == 2 && both->rank() == 1 - comm.rank(),
                   "keys order the split: rank " + std::to_string(comm.rank()) + " became " +
                       std::to_string(both->rank()) + " of " + std::to_string(both->size()));
      double y = 1.0;
      SP_RETURN_IF_ERROR(both->all_reduce(&y, 1, DType::kF64, ReduceOp::kSum));
      SP_CHECK_ARG(y == 2.0 && both->counters().sent(Phase::kOther) > 0, "all_reduce on the split");
    }
    return comm.barrier();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

// ---- device collectives against the host ones --------------------------------------------

struct Traffic {
  int64_t sent = 0, received = 0, to_next = 0;
};

Traffic traffic(const Communicator& c) {
  const CommCounters& k = c.counters();
  const size_t next = size_t((c.rank() + 1) % c.size());
  const int64_t to_next = c.size() > 1 && k.sent_to.size() > next ? k.sent_to[next][int(Phase::kOther)] : 0;
  return {k.sent(Phase::kOther), k.received(Phase::kOther), to_next};
}

Traffic since(const Traffic& before, const Traffic& after) {
  return {after.sent - before.sent, after.received - before.received, after.to_next - before.to_next};
}

// Holds a stream in a host callback until opened or `limit` has passed. Shared with the
// callback, which may outlive the test's frame when a check returns early.
struct Gate {
  std::atomic<bool> open{false};
  std::chrono::milliseconds limit;
  static void hold(void* self) {
    const auto* held = static_cast<std::shared_ptr<Gate>*>(self);
    const auto start = std::chrono::steady_clock::now();
    while (!(*held)->open && std::chrono::steady_clock::now() - start < (*held)->limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    delete held;
  }
};

// One collective, `call(in, out, order)`, run on host buffers and on device buffers holding the same
// input; the device input is written on the stream behind a gate, so a collective that does
// not wait for the stream reads zeros. A stream-ordered backend must return while the gate is
// still shut (it opens after 10 s; host-driven ones synchronise the stream, so it opens after
// 100 ms for them). in_place: the result is in `in`.
template <class Call>
Status compare_with_host(Communicator& c, cudaStream_t stream, const std::vector<char>& input, size_t out_bytes,
                         bool in_place, int64_t expected_sent, const std::string& what, Call call) {
  std::vector<char> host_in = input, host_out(out_bytes, 0x5a);
  const Traffic host_before = traffic(c);
  SP_RETURN_IF_ERROR(call(host_in.data(), host_out.data(), StreamOrder{}));
  const Traffic host_moved = since(host_before, traffic(c));

  SP_ASSIGN_OR_RETURN(DeviceBuffer staged, DeviceBuffer::allocate(std::max<size_t>(input.size(), 1)));
  SP_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(std::max<size_t>(input.size(), 1)));
  SP_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(std::max<size_t>(out_bytes, 1)));
  SP_RETURN_IF_ERROR(copy_bytes(staged.data(), input.data(), input.size()));
  auto gate = std::make_shared<Gate>();
  gate->limit = std::chrono::milliseconds(c.stream_ordered() ? 10000 : 100);
  if (cudaMemsetAsync(in.data(), 0, in.bytes(), stream) != cudaSuccess ||
      cudaMemsetAsync(out.data(), 0x5a, out.bytes(), stream) != cudaSuccess ||
      cudaLaunchHostFunc(stream, &Gate::hold, new std::shared_ptr<Gate>(gate)) != cudaSuccess ||
      cudaMemcpyAsync(in.data(), staged.data(), input.size(), cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "queueing the input failed");
  const Traffic device_before = traffic(c);
  const Status called = call(in.data(), out.data(), StreamOrder::on(stream));
  // A stream-ordered backend returns while the gate still holds the stream.
  const bool host_waited = cudaStreamQuery(stream) == cudaSuccess;
  gate->open = true;
  SP_RETURN_IF_ERROR(called);
  const Traffic device_moved = since(device_before, traffic(c));
  std::vector<char> device_out(in_place ? input.size() : out_bytes);
  if (cudaMemcpyAsync(device_out.data(), in_place ? in.data() : out.data(), device_out.size(), cudaMemcpyDeviceToHost,
                      stream) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "cudaMemcpyAsync failed");
  SP_RETURN_IF_ERROR(c.synchronize(stream));

  const std::string where = what + " on rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) +
                            " (" + c.backend_name() + ")";
  SP_CHECK_ARG(!(c.stream_ordered() && host_waited), where + ": the host waited for the stream");
  SP_CHECK_ARG(device_out == (in_place ? host_in : host_out), where + ": the device result differs from the host's");
  SP_CHECK_ARG(host_moved.sent == expected_sent && device_moved.sent == expected_sent,
               where + ": counted " + std::to_string(device_moved.sent) + " bytes on the device, " +
                   std::to_string(host_moved.sent) + " on the host, expected " + std::to_string(expected_sent));
  SP_CHECK_ARG(device_moved.received == host_moved.received && device_moved.to_next == host_moved.to_next,
               where + ": the device and host counters disagree per peer");
  return Status::Ok();
}

// Small integers, exact in every dtype and in any order of summation, different per rank.
std::vector<char> ramp(DType dtype, size_t count, int rank, int salt) {
  std::vector<float> values(count);
  for (size_t e = 0; e < count; ++e) values[e] = float((rank + 1) * int((e * 7 + size_t(rank + salt)) % 5 + 1));
  std::vector<char> bytes(count * dtype_size(dtype));
  convert(values.data(), DType::kF32, bytes.data(), dtype, count);
  return bytes;
}

int64_t piece_len(int i, int j) { return (2 * i + j) % 3 == 1 ? 0 : 1 + (i + 3 * j) % 4; }

Status check_device_collectives(Communicator& c) {
  const int P = c.size(), r = c.rank();
  c.set_phase(Phase::kOther);
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return SP_STATUS(StatusCode::kInternal, "cudaStreamCreate failed");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() {
      (void)forget_stream_arenas(s);
      (void)cudaStreamDestroy(s);
    }
  } guard{stream};

  // all_gather of 37 bytes per rank (not a multiple of any element size)
  const std::vector<char> mine = ramp(DType::kF32, 37, r, 0);
  const std::vector<char> piece(mine.begin(), mine.begin() + 37);
  SP_RETURN_IF_ERROR(compare_with_host(c, stream, piece, 37 * size_t(P), false, int64_t(P - 1) * 37, "all_gather",
                                       [&](void* in, void* out, StreamOrder o) { return c.all_gather(in, out, 37, o); }));

  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const std::string name = std::string(dtype_name(dtype)) + (op == ReduceOp::kSum ? " sum" : " max");
      const size_t es = dtype_size(dtype), count = 129;
      SP_RETURN_IF_ERROR(compare_with_host(
          c, stream, ramp(dtype, count * size_t(P), r, 1), count * es, false, int64_t(P - 1) * int64_t(count * es),
          "reduce_scatter " + name,
          [&](void* in, void* out, StreamOrder o) { return c.reduce_scatter(in, out, count, dtype, op, o); }));
      // 1001 elements: P = 2, 3, 4 pad the chunks; 1000 divides for P = 2, 4 (the ring runs in place).
      for (size_t n : {size_t(1001), size_t(1000)}) {
        const int64_t chunk = int64_t((n + size_t(P) - 1) / size_t(P));
        SP_RETURN_IF_ERROR(compare_with_host(c, stream, ramp(dtype, n, r, 2), n * es, true,
                                             2 * int64_t(P - 1) * chunk * int64_t(es),
                                             "all_reduce " + name + " of " + std::to_string(n),
                                             [&](void* in, void*, StreamOrder o) { return c.all_reduce(in, n, dtype, op, o); }));
      }
    }
  }

  // all_to_all_v: uneven int32 pieces (empty ones too), packed in peer order on both sides.
  std::vector<size_t> send_bytes(P), send_offsets(P), recv_bytes(P), recv_offsets(P);
  size_t in_total = 0, out_total = 0;
  int64_t sent = 0;
  for (int q = 0; q < P; ++q) {
    send_offsets[q] = in_total, send_bytes[q] = size_t(piece_len(r, q)) * 4, in_total += send_bytes[q];
    recv_offsets[q] = out_total, recv_bytes[q] = size_t(piece_len(q, r)) * 4, out_total += recv_bytes[q];
    if (q != r) sent += piece_len(r, q) * 4;
  }
  std::vector<char> pieces(in_total);
  for (size_t i = 0; i < in_total; ++i) pieces[i] = char(r * 31 + int(i));
  SP_RETURN_IF_ERROR(compare_with_host(c, stream, pieces, out_total, false, sent, "all_to_all_v", [&](void* in, void* out, StreamOrder o) {
    return c.all_to_all_v(in, send_bytes, send_offsets, out, recv_bytes, recv_offsets, o);
  }));
  const std::vector<char> blocks = ramp(DType::kF32, 6 * size_t(P), r, 3);
  return compare_with_host(c, stream, blocks, blocks.size(), false, int64_t(P - 1) * 24, "all_to_all",
                           [&](void* in, void* out, StreamOrder o) { return c.all_to_all(in, out, 24, o); });
}

// Thread ranks sharing GPU 0 through the local communicator: 2P ranks split into two groups of
// P (reversed by key), both groups at once.
class LocalDeviceCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LocalDeviceCollectives, MatchTheHostAndCountTheSameBytes) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "needs a CUDA device";
  const int P = GetParam();
  const Status s = run_local_ranks(2 * P, [](Communicator& world) -> Status {
    if (cudaSetDevice(0) != cudaSuccess) return SP_STATUS(StatusCode::kInternal, "cudaSetDevice failed");
    SP_ASSIGN_OR_RETURN(auto group, world.split(world.rank() % 2, -world.rank()));
    return check_device_collectives(*group);
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalDeviceCollectives, ::testing::Values(1, 2, 3, 4));

// NCCL over every visible GPU (up to 4): the world, then a split reversed by key.
TEST(NcclCommunicator, DeviceCollectivesMatchTheHostAndCountTheSameBytes) {
  if (cuda_device_count() < 1 || !nccl_available()) GTEST_SKIP() << "needs a CUDA device and NCCL";
  const int gpus = std::min(cuda_device_count(), 4);
  const Status s = run_nccl_local_ranks(gpus, [](Communicator& comm) -> Status {
    SP_RETURN_IF_ERROR(check_device_collectives(comm));
    SP_ASSIGN_OR_RETURN(auto reversed, comm.split(0, -comm.rank()));
    SP_CHECK_ARG(reversed->rank() == comm.size() - 1 - comm.rank(), "split order");
    return check_device_collectives(*reversed);
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace seqpar
