// The TCP exchange of tcp_bootstrap.hpp: rank 0 listens and hands its bytes to every rank that
// connects; the others connect, retrying until the communicator timeout.
#include "comm/tcp_bootstrap.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "seqpar/comm.hpp"

namespace seqpar {
namespace {

using Clock = std::chrono::steady_clock;

Status send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    SP_CHECK_ARG(w > 0, std::string("bootstrap send failed: ") + std::strerror(errno));
    p += w, n -= size_t(w);
  }
  return Status::Ok();
}

}  // namespace

Status serve_bytes(const void* data, size_t bytes, int port, int clients) {
  // Dual-stack IPv6 where the host has it, else IPv4.
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  const int one = 1, zero = 0;
  sockaddr_in6 addr6{};
  addr6.sin6_family = AF_INET6;
  addr6.sin6_addr = in6addr_any;
  addr6.sin6_port = htons(static_cast<uint16_t>(port));
  sockaddr_in addr4{};
  addr4.sin_family = AF_INET;
  addr4.sin_addr.s_addr = htonl(INADDR_ANY);
  addr4.sin_port = htons(static_cast<uint16_t>(port));
  bool bound = false;
  if (fd >= 0) {
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr6), sizeof(addr6)) == 0;
    if (!bound) ::close(fd);
  }
  if (!bound) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    SP_CHECK_ARG(fd >= 0, std::string("bootstrap socket: ") + std::strerror(errno));
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr4), sizeof(addr4)) == 0;
  }
  Status s = Status::Ok();
  if (!bound || ::listen(fd, clients) != 0)
    s = SP_STATUS(StatusCode::kCommError, "bootstrap: cannot listen on port " + std::to_string(port) +
                                              ": " + std::strerror(errno) + " (set SEQPAR_BOOTSTRAP_PORT)");
  const auto deadline = Clock::now() + comm_timeout();
  for (int served = 0; s.ok() && served < clients;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) {
      if (Clock::now() > deadline)
        s = SP_STATUS(StatusCode::kCommError, "bootstrap: only " + std::to_string(served) + " of " +
                                                  std::to_string(clients) + " ranks connected in time");
      continue;
    }
    const int c = ::accept(fd, nullptr, nullptr);
    if (c < 0) continue;
    s = send_all(c, data, bytes);
    ::close(c);
    ++served;
  }
  ::close(fd);
  return s;
}

Status fetch_bytes(const std::string& host, int port, void* data, size_t bytes) {
  const auto deadline = Clock::now() + comm_timeout();
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) == 0) {
      for (addrinfo* a = res; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          size_t got = 0;
          while (got < bytes) {
            const ssize_t r = ::recv(fd, static_cast<char*>(data) + got, bytes - got, 0);
            if (r <= 0) break;
            got += size_t(r);
          }
          ::close(fd);
          if (got == bytes) {
            ::freeaddrinfo(res);
            return Status::Ok();
          }
        } else {
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    SP_CHECK_ARG(Clock::now() < deadline, "bootstrap: could not reach rank 0 at " + host + ":" +
                                              std::to_string(port) + " in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}


}  // namespace seqpar
