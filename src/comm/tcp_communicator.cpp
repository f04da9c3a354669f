// The `tcp` communicator: CPU ranks as processes joined by a full mesh of TCP connections, for
// launchers that give no MPI (torchrun). Start-up:
//   1. rank 0 opens its mesh listener and hands a random job nonce and that listener's port to
//      each rank of the world through the token handshake of tcp_bootstrap.hpp (strangers get
//      nothing);
//   2. every other rank opens a listener of its own, connects to rank 0's with the nonce, its
//      rank and its port; rank 0 answers each with the table of every rank's address and port;
//   3. each pair (i, j), 0 < i < j, connects j -> i, opening with the nonce and j.
// split() builds a new mesh among each color's ranks the same way, its table gathered over the
// parent, so messages of different communicators never share a connection.
// Data: a batch runs to completion as soon as it is posted (overlaps() is false): every send and receive of
// the batch goes through one poll loop over non-blocking sockets, messages to and from a peer
// in posting order, each opened by its length so that mismatched batches fail with a message
// instead of corrupting data. A peer that dies shows as a closed connection at once; a silent
// one fails the wait after comm_timeout() without progress. abort() shuts every connection,
// so the peers fail at once too.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "comm/tcp_bootstrap.hpp"
#include "comm/tcp_socket.hpp"
#include "seqpar/comm.hpp"

namespace seqpar {
namespace {

constexpr size_t kNonceBytes = 16;
constexpr size_t kHostBytes = 64;  // a numeric IPv6 address fits with room to spare

using Nonce = std::array<char, kNonceBytes>;

// One rank's mesh endpoint, as it travels: the numeric host, NUL-padded, then the port.
struct Endpoint {
  char host[kHostBytes] = {};
  uint32_t port = 0;
};

// The first bytes on every mesh connection: the nonce, the connecting rank, its listener's port.
struct MeshHello {
  Nonce nonce{};
  uint32_t rank = 0, port = 0;
};

Status with_context(const Status& s, const std::string& what) {
  return s.ok() ? s : SP_STATUS(s.code(), what + ": " + s.message());
}

// Accepts connections on `listener` until every peer in `expected` has connected with a valid
// hello (its rank then gets the socket in fds); others are closed with a log line. A stranger
// that says nothing holds this rank up for at most 5 s.
Status accept_peers(int listener, const Nonce& nonce, std::vector<int> expected, std::vector<int>& fds,
                    std::vector<MeshHello>* hellos, TcpClock::time_point deadline) {
  while (!expected.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - TcpClock::now()).count();
    if (left <= 0)
      return SP_STATUS(StatusCode::kCommError, std::to_string(expected.size()) + " rank(s) never connected, rank " +
                                                   std::to_string(expected.front()) + " among them");
    pollfd f{listener, POLLIN, 0};
    if (::poll(&f, 1, int(std::min<int64_t>(left, 1000))) <= 0) continue;
    const int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) continue;
    MeshHello h;
    const Status got = tcp_recv_all(c, &h, sizeof(h), std::min(deadline, TcpClock::now() + std::chrono::seconds(5)));
    const auto it = std::find(expected.begin(), expected.end(), int(h.rank));
    if (!got.ok() || h.nonce != nonce || it == expected.end()) {
      std::fprintf(stderr, "seqpar tcp: refused a connection to the mesh (%s)\n",
                   got.ok() ? "not a rank this one waits for" : got.message().c_str());
      ::close(c);
      continue;
    }
    fds[h.rank] = c;
    if (hellos) (*hellos)[h.rank] = h;
    expected.erase(it);
  }
  return Status::Ok();
}

// Step 3 for one rank: connects to every lower rank without a socket yet, then accepts the
// higher ones. Connecting first and accepting second, in rank order, leaves no cycle to wait on.
Status connect_mesh(int rank, const std::vector<Endpoint>& table, int listener, const Nonce& nonce,
                    std::vector<int>& fds, TcpClock::time_point deadline) {
  const int size = int(table.size());
  for (int i = 0; i < rank; ++i) {
    if (fds[i] >= 0) continue;
    auto fd = tcp_connect(table[i].host, int(table[i].port), deadline);
    SP_RETURN_IF_ERROR(with_context(fd.status(), "connecting to rank " + std::to_string(i)));
    fds[i] = fd.value();
    MeshHello h{nonce, uint32_t(rank), 0};
    SP_RETURN_IF_ERROR(with_context(tcp_send_all(fds[i], &h, sizeof(h)), "greeting rank " + std::to_string(i)));
  }
  std::vector<int> expected;
  for (int j = rank + 1; j < size; ++j)
    if (fds[j] < 0) expected.push_back(j);
  return accept_peers(listener, nonce, expected, fds, nullptr, deadline);
}

Endpoint endpoint_of(const std::string& host, int port) {
  Endpoint e;
  std::snprintf(e.host, sizeof(e.host), "%s", host.c_str());
  e.port = uint32_t(port);
  return e;
}

// A message on the wire: its length, then its bytes. `done` counts both.
struct Transfer {
  char* data;
  uint64_t bytes;
  uint64_t header;
  size_t done = 0;
  size_t total() const { return sizeof(header) + bytes; }
};

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(int rank, std::vector<int> fds, std::string host, const Nonce& nonce)
      : rank_(rank), fds_(std::move(fds)), host_(std::move(host)), nonce_(nonce) {}
  ~TcpCommunicator() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  int rank() const override { return rank_; }
  int size() const override { return int(fds_.size()); }
  std::string backend_name() const override { return "tcp"; }

  StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    SP_RETURN_IF_ERROR(check_alive());
    // Who is in which group, in (key, rank) order, and where each member will listen.
    SP_ASSIGN_OR_RETURN(const int listener, tcp_listen(host_, 0, std::max(16, size())));
    auto bound = tcp_bound_port(listener);
    if (!bound.ok()) ::close(listener);
    SP_RETURN_IF_ERROR(bound.status());
    struct Member {
      int32_t color, key, rank;
      Endpoint at;
    };
    const Member mine{color, key, rank_, endpoint_of(host_, bound.value())};
    std::vector<Member> all(size());
    Status s = all_gather(&mine, all.data(), sizeof(Member));
    std::vector<Member> group;
    for (const Member& m : all)
      if (m.color == color) group.push_back(m);
    std::stable_sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
      return a.key != b.key ? a.key < b.key : a.rank < b.rank;
    });
    // A nonce of the group's own: the parent's, marked with this split's number and the color.
    Nonce nonce = nonce_;
    const uint64_t mark = (uint64_t(++splits_) << 32) ^ uint32_t(color);
    for (size_t i = 0; i < sizeof(mark); ++i) nonce[i] ^= char(mark >> (8 * i));
    std::vector<Endpoint> table;
    int me = 0;
    for (const Member& m : group) {
      if (m.rank == rank_) me = int(table.size());
      table.push_back(m.at);
    }
    std::vector<int> fds(group.size(), -1);
    if (s.ok()) s = connect_mesh(me, table, listener, nonce, fds, TcpClock::now() + comm_timeout());
    ::close(listener);
    if (s.ok())
      for (int fd : fds)
        if (fd >= 0 && s.ok()) s = tcp_make_data_socket(fd);
    if (!s.ok()) {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
      return with_context(s, "tcp split");
    }
    return std::unique_ptr<Communicator>(new TcpCommunicator(me, std::move(fds), host_, nonce));
  }

  void abort(const std::string& reason) override {
    if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
    for (int fd : fds_)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

 protected:
  StatusOr<std::unique_ptr<PendingExchange>> post(std::span<const SendSpec> sends,
                                                  std::span<const RecvSpec> recvs) override {
    SP_RETURN_IF_ERROR(check_alive());
    return std::unique_ptr<PendingExchange>(new Batch(*this, sends, recvs));
  }
  bool overlaps() const override { return false; }  // start_exchange waits at once

 private:
  // A posted batch; wait() moves it (the base class calls it straight after post).
  class Batch final : public PendingExchange {
   public:
    Batch(TcpCommunicator& c, std::span<const SendSpec> sends, std::span<const RecvSpec> recvs)
        : c_(c), sends_(sends.begin(), sends.end()), recvs_(recvs.begin(), recvs.end()) {}
    Status wait() override {
      if (done_) return Status::Ok();
      done_ = true;
      const Status s = c_.run_batch(sends_, recvs_);
      if (!s.ok()) c_.abort(s.message());  // the mesh is out of step now: no later call may use it
      return s;
    }

   private:
    TcpCommunicator& c_;
    std::vector<SendSpec> sends_;
    std::vector<RecvSpec> recvs_;
    bool done_ = false;
  };

  Status check_alive() const {
    return aborted_.empty() ? Status::Ok()
                            : SP_STATUS(StatusCode::kCommError, "communicator aborted: " + aborted_);
  }

  Status run_batch(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    const int P = size();
    std::vector<std::deque<Transfer>> out(P), in(P);
    std::deque<const SendSpec*> to_self;
    for (const SendSpec& s : sends) {
      if (s.peer == rank_) to_self.push_back(&s);
      else out[s.peer].push_back({const_cast<char*>(static_cast<const char*>(s.data)), s.bytes, s.bytes});
    }
    for (const RecvSpec& r : recvs) {
      if (r.peer == rank_) {  // matched with this rank's own sends in order
        SP_CHECK_ARG(!to_self.empty(), "rank " + std::to_string(rank_) + " receives from itself more than it sends");
        SP_CHECK_ARG(to_self.front()->bytes == r.bytes, "a message to itself has " +
                                                            std::to_string(to_self.front()->bytes) + " bytes; " +
                                                            std::to_string(r.bytes) + " expected");
        if (r.bytes) std::memmove(r.data, to_self.front()->data, r.bytes);
        to_self.pop_front();
        continue;
      }
      in[r.peer].push_back({static_cast<char*>(r.data), r.bytes, 0});
    }
    auto last_progress = TcpClock::now();
    const auto timeout = comm_timeout();
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<int> peer_of;
      for (int p = 0; p < P; ++p) {
        const short ev = short((out[p].empty() ? 0 : POLLOUT) | (in[p].empty() ? 0 : POLLIN));
        if (!ev) continue;
        fds.push_back({fds_[p], ev, 0});
        peer_of.push_back(p);
      }
      if (fds.empty()) return Status::Ok();
      const int ready = ::poll(fds.data(), fds.size(), 200);
      if (ready < 0 && errno != EINTR)
        return SP_STATUS(StatusCode::kCommError, std::string("poll failed: ") + std::strerror(errno));
      bool progress = false;
      for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        const int p = peer_of[i];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          if (in[p].empty()) return lost(p, "sent to it");  // a hang-up while only sending
          SP_RETURN_IF_ERROR(receive(p, in[p], &progress));
        }
        if ((fds[i].revents & POLLOUT) && !out[p].empty()) SP_RETURN_IF_ERROR(send(p, out[p], &progress));
      }
      if (progress) last_progress = TcpClock::now();
      else if (TcpClock::now() - last_progress > timeout)
        return SP_STATUS(StatusCode::kCommError,
                         "rank " + std::to_string(rank_) + " timed out: " +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                             " ms without progress from its peers (SEQPAR_COMM_TIMEOUT_S)");
    }
  }

  Status lost(int peer, const char* doing) const {
    return SP_STATUS(StatusCode::kCommError, "rank " + std::to_string(rank_) + ": the connection to rank " +
                                                 std::to_string(peer) + " closed while it " + doing +
                                                 " (that rank died or its communicator aborted)");
  }

  Status receive(int p, std::deque<Transfer>& q, bool* progress) {
    Transfer& t = q.front();
    char* dst = t.done < sizeof(t.header) ? reinterpret_cast<char*>(&t.header) + t.done
                                          : t.data + (t.done - sizeof(t.header));
    const size_t want = t.done < sizeof(t.header) ? sizeof(t.header) - t.done : t.total() - t.done;
    const ssize_t r = ::recv(fds_[p], dst, want, 0);
    if (r == 0) return lost(p, "was receiving");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      if (errno == ECONNRESET) return lost(p, "was receiving");
      return SP_STATUS(StatusCode::kCommError, "rank " + std::to_string(rank_) + ": receiving from rank " +
                                                   std::to_string(p) + " failed: " + std::strerror(errno));
    }
    *progress = true;
    t.done += size_t(r);
    if (t.done == sizeof(t.header) && t.header != t.bytes)
      return SP_STATUS(StatusCode::kCommError, "rank " + std::to_string(rank_) + " expected " +
                                                   std::to_string(t.bytes) + " bytes from rank " + std::to_string(p) +
                                                   " and it sent " + std::to_string(t.header) +
                                                   ": the ranks posted different batches");
    if (t.done == t.total()) q.pop_front();
    return Status::Ok();
  }

  Status send(int p, std::deque<Transfer>& q, bool* progress) {
    Transfer& t = q.front();
    const char* src = t.done < sizeof(t.header) ? reinterpret_cast<const char*>(&t.header) + t.done
                                                : t.data + (t.done - sizeof(t.header));
    const size_t want = t.done < sizeof(t.header) ? sizeof(t.header) - t.done : t.total() - t.done;
    const ssize_t w = ::send(fds_[p], src, want, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      if (errno == EPIPE || errno == ECONNRESET) return lost(p, "was sending");
      return SP_STATUS(StatusCode::kCommError, "rank " + std::to_string(rank_) + ": sending to rank " +
                                                   std::to_string(p) + " failed: " + std::strerror(errno));
    }
    *progress = true;
    t.done += size_t(w);
    if (t.done == t.total()) q.pop_front();
    return Status::Ok();
  }

  int rank_;
  std::vector<int> fds_;  // the connection to each peer; -1 for this rank
  std::string host_;      // the address this rank's peers reach it at
  Nonce nonce_;
  uint32_t splits_ = 0;
  std::string aborted_;   // why, once aborted
};

// Steps 1 and 2 for rank 0: serve the nonce and port, then collect every rank's endpoint and
// send back the table. Returns the table; fds get the connections to ranks 1..P-1.
Status gather_table_as_root(const TcpWorld& w, int listener, const Nonce& nonce, std::vector<Endpoint>& table,
                            std::vector<int>& fds) {
  SP_ASSIGN_OR_RETURN(const int port, tcp_bound_port(listener));
  std::vector<char> offer(nonce.begin(), nonce.end());
  const uint32_t p32 = uint32_t(port);
  offer.insert(offer.end(), reinterpret_cast<const char*>(&p32), reinterpret_cast<const char*>(&p32) + 4);
  const BootstrapPeer me{w.token, 0, w.world};
  SP_RETURN_IF_ERROR(serve_bytes(offer.data(), offer.size(), w.listen_host.empty() ? w.master_addr : w.listen_host,
                                 w.port, me));
  std::vector<int> expected;
  for (int r = 1; r < w.world; ++r) expected.push_back(r);
  std::vector<MeshHello> hellos(w.world);
  SP_RETURN_IF_ERROR(
      accept_peers(listener, nonce, expected, fds, &hellos, TcpClock::now() + comm_timeout()));
  // Rank 0's address is the one its peers reached it at; each peer's, the one it came from.
  table[0] = endpoint_of(tcp_local_address(fds[1]), port);
  for (int r = 1; r < w.world; ++r) table[r] = endpoint_of(tcp_peer_address(fds[r]), int(hellos[r].port));
  for (int r = 1; r < w.world; ++r)
    SP_RETURN_IF_ERROR(tcp_send_all(fds[r], table.data(), table.size() * sizeof(Endpoint)));
  return Status::Ok();
}

// Steps 1 and 2 for another rank; *listener receives its own mesh listener.
Status fetch_table(const TcpWorld& w, int* listener, Nonce& nonce, std::vector<Endpoint>& table,
                   std::vector<int>& fds) {
  char offer[kNonceBytes + 4];
  const BootstrapPeer me{w.token, w.rank, w.world};
  SP_RETURN_IF_ERROR(fetch_bytes(w.master_addr, w.port, offer, sizeof(offer), me));
  std::memcpy(nonce.data(), offer, kNonceBytes);
  uint32_t root_port = 0;
  std::memcpy(&root_port, offer + kNonceBytes, 4);
  const auto deadline = TcpClock::now() + comm_timeout();
  SP_ASSIGN_OR_RETURN(fds[0], tcp_connect(w.master_addr, int(root_port), deadline));
  // Listen on the address this rank reached rank 0 from: the others can reach it there too.
  SP_ASSIGN_OR_RETURN(*listener, tcp_listen(tcp_local_address(fds[0]), 0, std::max(16, w.world)));
  SP_ASSIGN_OR_RETURN(const int port, tcp_bound_port(*listener));
  const MeshHello h{nonce, uint32_t(w.rank), uint32_t(port)};
  SP_RETURN_IF_ERROR(tcp_send_all(fds[0], &h, sizeof(h)));
  return with_context(tcp_recv_all(fds[0], table.data(), table.size() * sizeof(Endpoint), deadline),
                      "reading the mesh table from rank 0");
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> make_tcp_communicator(const TcpWorld& w) {
  SP_CHECK_ARG(w.world >= 1 && w.rank >= 0 && w.rank < w.world,
               "rank " + std::to_string(w.rank) + " is out of range for a world of " + std::to_string(w.world));
  std::vector<int> fds(w.world, -1);
  Nonce nonce{};
  if (w.world == 1) return std::unique_ptr<Communicator>(new TcpCommunicator(0, fds, "127.0.0.1", nonce));
  std::vector<Endpoint> table(w.world);
  int listener = -1;
  Status s = Status::Ok();
  if (w.rank == 0) {
    std::random_device random;
    for (char& c : nonce) c = char(random());
    auto l = tcp_listen(w.listen_host.empty() ? w.master_addr : w.listen_host, 0, std::max(16, w.world));
    s = l.status();
    if (s.ok()) listener = l.value(), s = gather_table_as_root(w, listener, nonce, table, fds);
  } else {
    s = fetch_table(w, &listener, nonce, table, fds);
  }
  if (s.ok()) s = connect_mesh(w.rank, table, listener, nonce, fds, TcpClock::now() + comm_timeout());
  if (listener >= 0) ::close(listener);
  for (int fd : fds)
    if (fd >= 0 && s.ok()) s = tcp_make_data_socket(fd);
  if (!s.ok()) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    return with_context(s, "tcp communicator, rank " + std::to_string(w.rank));
  }
  return std::unique_ptr<Communicator>(new TcpCommunicator(w.rank, std::move(fds), table[w.rank].host, nonce));
}

StatusOr<std::unique_ptr<Communicator>> make_tcp_world_communicator() {
  SP_CHECK_ARG(launched_by_torchrun(), "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set");
  const BootstrapPeer me = bootstrap_peer_from_env();
  SP_CHECK_ARG(me.world >= 1 && me.rank >= 0 && me.rank < me.world,
               "RANK " + std::to_string(me.rank) + " is out of range for WORLD_SIZE " + std::to_string(me.world));
  TcpWorld w;
  w.master_addr = std::getenv("MASTER_ADDR");
  w.port = bootstrap_port();
  w.token = me.token, w.rank = me.rank, w.world = me.world;
  if (me.rank == 0) w.listen_host = bootstrap_listen_host(w.master_addr, me);
  return make_tcp_communicator(w);
}

}  // namespace seqpar
