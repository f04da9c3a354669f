// The TCP exchange of tcp_bootstrap.hpp. Rank 0 keeps every connection it has accepted in one
// poll set and reads each one's hello as its bytes come, so a stranger that connects and sends
// nothing (a port probe, a health check) costs it nothing; a connection without a whole hello
// after kHelloWait is dropped. Valid hellos get 'K' and the bytes; others 'R' and a reason.
#include "comm/tcp_bootstrap.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "comm/tcp_socket.hpp"
#include "seqpar/comm.hpp"

namespace seqpar {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'S', 'E', 'Q', 'P', 'A', 'R', 'B', '1'};
constexpr size_t kMaxToken = 1024;
constexpr auto kHelloWait = std::chrono::seconds(5);
constexpr size_t kMaxPending = 64;  // connections without a whole hello yet; the oldest go first

// The hello: magic, token length (u32), token, rank (i32), world size (i32), little-endian.
std::vector<char> hello_of(const BootstrapPeer& me) {
  std::vector<char> h(kMagic, kMagic + sizeof(kMagic));
  const auto put = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) h.push_back(char((v >> (8 * i)) & 0xff));
  };
  put(uint32_t(me.token.size()));
  h.insert(h.end(), me.token.begin(), me.token.end());
  put(uint32_t(me.rank)), put(uint32_t(me.world));
  return h;
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}

// A connection's hello so far. parse: 0 incomplete, 1 whole (rank and token set), -1 junk.
struct Pending {
  int fd = -1;
  Clock::time_point since;
  std::vector<char> got;
  int parse(std::string* token, int* rank, int* world) const {
    const size_t head = sizeof(kMagic) + 4;
    if (std::memcmp(got.data(), kMagic, std::min(got.size(), sizeof(kMagic))) != 0) return -1;
    if (got.size() < head) return 0;
    const uint32_t n = get_u32(got.data() + sizeof(kMagic));
    if (n > kMaxToken) return -1;
    if (got.size() < head + n + 8) return 0;
    if (got.size() > head + n + 8) return -1;
    token->assign(got.data() + head, n);
    *rank = int(get_u32(got.data() + head + n)), *world = int(get_u32(got.data() + head + n + 4));
    return 1;
  }
};

void log_refusal(const std::string& why) { std::fprintf(stderr, "seqpar bootstrap: refused a connection: %s\n", why.c_str()); }

// A listening socket for the bootstrap, with the hint a failure needs.
StatusOr<int> listen_on(const std::string& host, int port, int backlog) {
  auto fd = tcp_listen(host, port, backlog);
  if (fd.ok()) return fd;
  return SP_STATUS(StatusCode::kCommError, "bootstrap: " + fd.status().message() +
                                               " (set SEQPAR_BOOTSTRAP_PORT, or SEQPAR_BOOTSTRAP_LISTEN_ALL=1 "
                                               "where MASTER_ADDR is not an address of this host)");
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool loopback = res != nullptr;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      loopback &= (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (a->ai_family == AF_INET6)
      loopback &= IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  ::freeaddrinfo(res);
  return loopback;
}

std::string bootstrap_listen_host(const std::string& master, const BootstrapPeer& me) {
  const char* all = std::getenv("SEQPAR_BOOTSTRAP_LISTEN_ALL");
  bool everywhere = all && std::string(all) == "1";
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int local_world = local && *local ? std::atoi(local) : me.world;
  if (!everywhere && local_world < me.world && is_loopback_host(master)) {
    std::fprintf(stderr, "seqpar bootstrap: MASTER_ADDR %s is a loopback address and the job spans nodes: "
                         "listening on every interface\n", master.c_str());
    everywhere = true;
  }
  if (me.token.empty() || me.token == "none")
    std::fprintf(stderr, "seqpar bootstrap: warning: no job token (set SEQPAR_JOB_TOKEN to a secret shared by "
                         "the job's ranks): any process that can reach port %d may join the job\n", bootstrap_port());
  return everywhere ? "*" : master;
}

int bootstrap_port() {
  const char* port = std::getenv("SEQPAR_BOOTSTRAP_PORT");
  if (port && *port) return std::atoi(port);
  const char* master = std::getenv("MASTER_PORT");
  return (master && *master ? std::atoi(master) : 29500) + 1;
}

BootstrapPeer bootstrap_peer_from_env() {
  BootstrapPeer p;
  const char* token = std::getenv("SEQPAR_JOB_TOKEN");
  if (!token) token = std::getenv("TORCHELASTIC_RUN_ID");
  p.token = token ? token : "";
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  p.rank = rank ? std::atoi(rank) : 0;
  p.world = world ? std::atoi(world) : 1;
  return p;
}

Status serve_bytes(const void* data, size_t bytes, const std::string& host, int port, const BootstrapPeer& me) {
  SP_ASSIGN_OR_RETURN(const int fd, listen_on(host, port, std::max(16, me.world)));
  std::set<int> served;
  std::vector<Pending> pending;
  const auto deadline = Clock::now() + comm_timeout();
  Status s = Status::Ok();
  const auto refuse = [&](Pending& p, const std::string& why) {
    log_refusal(why);
    const std::string reply = "R" + why;
    (void)tcp_send_all(p.fd, reply.data(), reply.size());
    ::close(p.fd);
    p.fd = -1;
  };
  while (s.ok() && int(served.size()) < me.world - 1) {
    std::vector<pollfd> fds{{fd, POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    (void)::poll(fds.data(), fds.size(), 200);
    if (fds[0].revents & POLLIN) {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c >= 0) pending.push_back({c, Clock::now(), {}});
      if (pending.size() > kMaxPending) {  // a flood: drop the oldest silent one
        log_refusal("too many connections without a hello");
        ::close(pending.front().fd);
        pending.erase(pending.begin());
      }
    }
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      Pending& p = pending[i];
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[512];
      const ssize_t r = ::recv(p.fd, buf, sizeof(buf), 0);
      if (r <= 0) {  // gone before a whole hello
        ::close(p.fd);
        p.fd = -1;
        continue;
      }
      p.got.insert(p.got.end(), buf, buf + r);
      std::string token;
      int rank = -1, world = 0;
      const int parsed = p.parse(&token, &rank, &world);
      if (parsed == 0) continue;
      if (parsed < 0) {
        refuse(p, "not a seqpar rank (bad hello)");
      } else if (token != me.token) {
        refuse(p, "rank " + std::to_string(rank) + " gave another job's token");
      } else if (world != me.world || rank < 1 || rank >= me.world) {
        refuse(p, "rank " + std::to_string(rank) + " of " + std::to_string(world) + " is not a rank of this world of " +
                      std::to_string(me.world));
      } else if (served.count(rank)) {
        refuse(p, "rank " + std::to_string(rank) + " was served already");
      } else {
        const Status sent = tcp_send_all(p.fd, "K", 1);
        if (sent.ok() && tcp_send_all(p.fd, data, bytes).ok()) served.insert(rank);
        ::close(p.fd);
        p.fd = -1;
      }
    }
    for (Pending& p : pending)
      if (p.fd >= 0 && Clock::now() - p.since > kHelloWait) {
        log_refusal("no hello within " + std::to_string(kHelloWait.count()) + " s");
        ::close(p.fd);
        p.fd = -1;
      }
    std::erase_if(pending, [](const Pending& p) { return p.fd < 0; });
    if (int(served.size()) < me.world - 1 && Clock::now() > deadline)
      s = SP_STATUS(StatusCode::kCommError, "bootstrap: only " + std::to_string(served.size()) + " of " +
                                                std::to_string(me.world - 1) + " ranks connected in time");
  }
  for (const Pending& p : pending) ::close(p.fd);
  ::close(fd);
  return s;
}

Status fetch_bytes(const std::string& host, int port, void* data, size_t bytes, const BootstrapPeer& me) {
  const std::vector<char> hello = hello_of(me);
  const auto deadline = Clock::now() + comm_timeout();
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) == 0) {
      for (addrinfo* a = res; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 || !tcp_send_all(fd, hello.data(), hello.size()).ok()) {
          ::close(fd);
          continue;
        }
        // Whatever listens there answers within a few seconds or is not rank 0; read no more
        // than a reply can hold.
        timeval wait{5, 0};
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
        std::vector<char> got;
        char buf[512];
        for (ssize_t r; got.size() <= bytes + 1024 && (r = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
          got.insert(got.end(), buf, buf + r);
        ::close(fd);
        if (!got.empty() && got[0] == 'R') {
          ::freeaddrinfo(res);
          return SP_STATUS(StatusCode::kCommError, "bootstrap: rank 0 at " + host + ":" + std::to_string(port) +
                                                       " refused rank " + std::to_string(me.rank) + ": " +
                                                       std::string(got.begin() + 1, got.end()));
        }
        if (got.size() == bytes + 1 && got[0] == 'K') {
          std::memcpy(data, got.data() + 1, bytes);
          ::freeaddrinfo(res);
          return Status::Ok();
        }
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline)
      return SP_STATUS(StatusCode::kCommError, "bootstrap: could not reach rank 0 at " + host + ":" +
                                                   std::to_string(port) + " in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace seqpar
