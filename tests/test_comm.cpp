// Communicators, the local one (thread ranks) and tcp (a TCP mesh on loopback, its ranks here as
// threads): batched exchange (P = 2 included), collectives against a direct computation,
// all_to_all_v with uneven splits over a split, byte counters per phase and per peer, and a
// failed or silent rank ending in an error, not a hang.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "seqpar/comm.hpp"

namespace seqpar {
namespace {

// run_local_ranks for the tcp communicator: P threads, each a rank of a fresh mesh on loopback.
// A rank that fails aborts its communicator, which closes its connections, so the others fail
// at once (as a dead process's would).
Status run_tcp_ranks(int P, const std::function<Status(Communicator&)>& fn) {
  static std::mt19937 ports(std::random_device{}());
  const int port = 20000 + int(ports() % 30000);
  std::vector<Status> results(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      auto comm = make_tcp_communicator({"127.0.0.1", port, "", "test-job", r, P});
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      results[r] = fn(*comm.value());
      if (!results[r].ok()) comm.value()->abort(results[r].message());
    });
  for (auto& t : threads) t.join();
  return first_root_cause(results);
}

using RankRunner = Status (*)(int, const std::function<Status(Communicator&)>&);
RankRunner runner(const std::string& backend) { return backend == "tcp" ? run_tcp_ranks : run_local_ranks; }
std::string backend_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

class Comm : public ::testing::TestWithParam<std::string> {};

TEST_P(Comm, PairExchangeWithSamePrevAndNextKeepsOrder) {
  const Status s = runner(GetParam())(2, [](Communicator& c) -> Status {
    const int other = 1 - c.rank();
    std::vector<int> k(100, 10 + c.rank()), v(50, 20 + c.rank()), k_in(100), v_in(50);
    const SendSpec sends[] = {{other, k.data(), 400}, {other, v.data(), 200}};
    const RecvSpec recvs[] = {{other, k_in.data(), 400}, {other, v_in.data(), 200}};
    SP_RETURN_IF_ERROR(c.exchange(sends, recvs));
    SP_CHECK_ARG(k_in[99] == 10 + other && v_in[0] == 20 + other, "wrong data received");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, MatchDirectComputationAndCountBytes) {
  const int P = std::get<1>(GetParam());
  const Status s = runner(std::get<0>(GetParam()))(P, [P](Communicator& c) -> Status {
    const int r = c.rank();
    c.set_phase(Phase::kForward);
    // all_gather of 3 doubles per rank
    std::vector<double> mine{r + 0.5, r * 2.0, -1.0 * r}, all(3 * P);
    SP_RETURN_IF_ERROR(c.all_gather(mine.data(), all.data(), 3 * sizeof(double)));
    for (int q = 0; q < P; ++q) SP_CHECK_ARG(all[3 * q] == q + 0.5 && all[3 * q + 1] == 2.0 * q, "all_gather");
    SP_CHECK_ARG(c.counters().sent(Phase::kForward) == int64_t(P - 1) * 24, "all_gather bytes");

    // reduce_scatter (sum) of P blocks of 5 floats: element e of block b from rank q = q*100+b*10+e
    c.set_phase(Phase::kBackward);
    std::vector<float> send(5 * P), got(5);
    for (int b = 0; b < P; ++b)
      for (int e = 0; e < 5; ++e) send[b * 5 + e] = float(r * 100 + b * 10 + e);
    SP_RETURN_IF_ERROR(c.reduce_scatter(send.data(), got.data(), 5, DType::kF32, ReduceOp::kSum));
    for (int e = 0; e < 5; ++e) {
      const float want = 100.0f * (P * (P - 1) / 2) + P * (r * 10.0f + e);
      SP_CHECK_ARG(got[e] == want, "reduce_scatter");
    }
    SP_CHECK_ARG(c.counters().sent(Phase::kBackward) == int64_t(P - 1) * 20, "reduce_scatter bytes");
    SP_CHECK_ARG(c.counters().sent(Phase::kForward) == int64_t(P - 1) * 24, "phases mixed");

    // all_to_all: block q of rank r holds r*1000+q
    c.set_phase(Phase::kOther);
    std::vector<int64_t> a2a_in(P), a2a_out(P);
    for (int q = 0; q < P; ++q) a2a_in[q] = r * 1000 + q;
    SP_RETURN_IF_ERROR(c.all_to_all(a2a_in.data(), a2a_out.data(), sizeof(int64_t)));
    for (int q = 0; q < P; ++q) SP_CHECK_ARG(a2a_out[q] == q * 1000 + r, "all_to_all");
    SP_CHECK_ARG(c.counters().sent(Phase::kOther) == int64_t(P - 1) * 8, "all_to_all bytes");

    // all_reduce sum and max over a count that P does not divide
    std::vector<double> x(7);
    for (int e = 0; e < 7; ++e) x[e] = r + e;
    std::vector<double> y = x;
    SP_RETURN_IF_ERROR(c.all_reduce(x.data(), 7, DType::kF64, ReduceOp::kSum));
    SP_RETURN_IF_ERROR(c.all_reduce(y.data(), 7, DType::kF64, ReduceOp::kMax));
    for (int e = 0; e < 7; ++e) {
      SP_CHECK_ARG(x[e] == P * (P - 1) / 2.0 + P * e, "all_reduce sum");
      SP_CHECK_ARG(y[e] == P - 1 + e, "all_reduce max");
    }
    // Each all_reduce: 2 (P-1) chunks of ceil(7 / P) doubles, all to the next rank.
    const int64_t all_reduce_bytes = 2 * int64_t(P - 1) * ((7 + P - 1) / P) * 8;
    SP_CHECK_ARG(c.counters().sent(Phase::kOther) == int64_t(P - 1) * 8 + 2 * all_reduce_bytes,
                 "all_reduce bytes");
    if (P > 1)
      SP_CHECK_ARG(c.counters().sent_to[(r + 1) % P][int(Phase::kOther)] == c.counters().sent(Phase::kOther) -
                                                                                 int64_t(P - 2) * 8,
                   "the ring sends to the next rank; all_to_all to every rank");
    SP_RETURN_IF_ERROR(c.barrier());

    // split into even and odd ranks, reversed order by key; sum of ranks inside each group
    SP_ASSIGN_OR_RETURN(auto sub, c.split(r % 2, -r));
    int64_t members = (P - r % 2 + 1) / 2;
    SP_CHECK_ARG(sub->size() == members, "split size");
    SP_CHECK_ARG(sub->rank() == members - 1 - r / 2, "split orders by key");
    double top = r;
    SP_RETURN_IF_ERROR(sub->all_reduce(&top, 1, DType::kF64, ReduceOp::kMax));
    int largest = r % 2;
    while (largest + 2 < P) largest += 2;
    SP_CHECK_ARG(top == largest, "split group max");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::Values("local", "tcp"), ::testing::Values(1, 2, 3, 4, 8)));

// Int32 elements rank i sends rank j in the all_to_all_v tests: uneven, with empty pieces
// between distinct ranks (from P = 2 up) and to oneself.
int64_t piece_len(int i, int j) { return (2 * i + j) % 3 == 1 ? 0 : 1 + (i + 3 * j) % 4; }

// all_to_all_v over a split of 2P thread ranks into two groups of P (reversed by key, so group
// ranks differ from world ranks), both groups at once: uneven pieces at scattered offsets,
// gaps left alone, and the counters equal the closed forms.
class AllToAllV : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AllToAllV, UnevenSplitsOverASplitCommunicator) {
  const int P = std::get<1>(GetParam());
  const Status s = runner(std::get<0>(GetParam()))(2 * P, [P](Communicator& world) -> Status {
    SP_ASSIGN_OR_RETURN(auto sub, world.split(world.rank() % 2, -world.rank()));
    Communicator& c = *sub;
    SP_CHECK_ARG(c.size() == P, "split size");
    const int r = c.rank();
    const int32_t group = world.rank() % 2;
    auto value = [&](int from, int to, int64_t k) { return int32_t(group * 1000000 + from * 10000 + to * 100 + k); };
    // Send pieces in peer order with one spare element before each; receive pieces in reverse
    // peer order, also spaced, into a buffer of -1s.
    std::vector<size_t> send_bytes(P), send_offsets(P), recv_bytes(P), recv_offsets(P);
    std::vector<int32_t> in, out;
    for (int q = 0; q < P; ++q) {
      in.push_back(-7);
      send_offsets[q] = in.size() * 4, send_bytes[q] = size_t(piece_len(r, q)) * 4;
      for (int64_t k = 0; k < piece_len(r, q); ++k) in.push_back(value(r, q, k));
    }
    size_t end = 0;
    for (int q = P - 1; q >= 0; --q) {
      recv_offsets[q] = (end + 1) * 4, recv_bytes[q] = size_t(piece_len(q, r)) * 4;
      end += 1 + size_t(piece_len(q, r));
    }
    out.assign(end + 1, -1);
    SP_RETURN_IF_ERROR(c.all_to_all_v(in.data(), send_bytes, send_offsets, out.data(), recv_bytes, recv_offsets));
    std::vector<int32_t> want(end + 1, -1);
    for (int q = 0; q < P; ++q)
      for (int64_t k = 0; k < piece_len(q, r); ++k) want[recv_offsets[q] / 4 + size_t(k)] = value(q, r, k);
    SP_CHECK_ARG(out == want, "all_to_all_v moved the wrong bytes on rank " + std::to_string(r));
    int64_t sent = 0, received = 0;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      sent += piece_len(r, q) * 4, received += piece_len(q, r) * 4;
      const int64_t to_q = P > 1 ? c.counters().sent_to[q][int(Phase::kOther)] : 0;
      SP_CHECK_ARG(to_q == piece_len(r, q) * 4, "bytes to rank " + std::to_string(q));
    }
    SP_CHECK_ARG(c.counters().sent(Phase::kOther) == sent && c.counters().received(Phase::kOther) == received,
                 "all_to_all_v counted " + std::to_string(c.counters().sent(Phase::kOther)) + " bytes, not " +
                     std::to_string(sent));
    // The piece a rank keeps is not traffic.
    SP_CHECK_ARG(c.counters().sent_to.size() <= size_t(r) || c.counters().sent_to[r][int(Phase::kOther)] == 0,
                 "a rank's own piece was counted");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllV,
                         ::testing::Combine(::testing::Values("local", "tcp"), ::testing::Values(1, 2, 3, 4)));

TEST(LocalComm, AllToAllVRejectsBadSplits) {
  auto comms = make_local_communicators(1);
  int32_t in[4] = {1, 2, 3, 4}, out[4] = {};
  const size_t four[] = {4}, eight[] = {8}, zero[] = {0}, two_zeros[] = {0, 0};
  // wrong number of entries; keeping 4 bytes but expecting 8; pieces without a buffer
  EXPECT_EQ(comms[0]->all_to_all_v(in, two_zeros, two_zeros, out, two_zeros, two_zeros).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->all_to_all_v(in, four, zero, out, eight, zero).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->all_to_all_v(nullptr, four, zero, out, four, zero).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(comms[0]->all_to_all_v(in, eight, four, out, eight, zero).ok());
  EXPECT_TRUE(out[0] == 2 && out[1] == 3 && out[2] == 0);
  EXPECT_EQ(comms[0]->counters().sent(Phase::kOther), 0);
}

TEST_P(Comm, SplitGroupsAreIndependent) {
  const Status s = runner(GetParam())(6, [](Communicator& c) -> Status {
    SP_ASSIGN_OR_RETURN(auto sub, c.split(c.rank() % 3, c.rank()));
    SP_CHECK_ARG(sub->size() == 2 && sub->rank() == c.rank() / 3, "split rank");
    double v = c.rank();
    SP_RETURN_IF_ERROR(sub->all_reduce(&v, 1, DType::kF64, ReduceOp::kSum));
    SP_CHECK_ARG(v == 2 * (c.rank() % 3) + 3, "group sum");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST_P(Comm, FailedRankMakesOthersFailNotHang) {
  const Status s = runner(GetParam())(3, [](Communicator& c) -> Status {
    if (c.rank() == 1) return SP_STATUS(StatusCode::kInternal, "rank 1 broke");
    std::vector<char> buf(8, 0);
    return c.all_gather(buf.data() + c.rank(), buf.data(), 1);
  });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("rank 1 broke"), std::string::npos);
}

TEST_P(Comm, SilentPeerTimesOut) {
  setenv("SEQPAR_COMM_TIMEOUT_S", "0.5", 1);
  const Status s = runner(GetParam())(2, [](Communicator& c) -> Status {
    if (c.rank() == 0) {  // stays, but never sends
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return Status::Ok();
    }
    int x = 0;
    const RecvSpec recv{0, &x, sizeof(x)};
    return c.exchange({}, {&recv, 1});
  });
  unsetenv("SEQPAR_COMM_TIMEOUT_S");
  EXPECT_EQ(s.code(), StatusCode::kCommError);
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
}

TEST_P(Comm, SizeMismatchIsAnError) {
  const Status s = runner(GetParam())(2, [](Communicator& c) -> Status {
    std::vector<char> out(16), in(16);
    const SendSpec send{1 - c.rank(), out.data(), c.rank() == 0 ? 16u : 8u};
    const RecvSpec recv{1 - c.rank(), in.data(), 16};
    return c.exchange({&send, 1}, {&recv, 1});
  });
  EXPECT_EQ(s.code(), StatusCode::kCommError);
}

INSTANTIATE_TEST_SUITE_P(Backends, Comm, ::testing::Values("local", "tcp"), backend_name);

TEST(LocalComm, RejectsBadPeer) {
  auto comms = make_local_communicators(2);
  int x = 0;
  const SendSpec send{5, &x, 4};
  EXPECT_EQ(comms[0]->exchange({&send, 1}, {}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace seqpar
