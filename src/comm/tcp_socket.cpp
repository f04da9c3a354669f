// The socket helpers of tcp_socket.hpp (POSIX sockets, IPv4 and IPv6).
#include "comm/tcp_socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace seqpar {
namespace {

std::string numeric_address(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof(text));
  else if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    // An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d: give the IPv4 form.
    if (IN6_IS_ADDR_V4MAPPED(&v6)) ::inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof(text));
    else ::inet_ntop(AF_INET6, &v6, text, sizeof(text));
  }
  return text;
}

}  // namespace

StatusOr<int> tcp_listen(const std::string& host, int port, int backlog) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const bool all = host.empty() || host == "*";
  const std::string port_text = std::to_string(port);
  if (all) hints.ai_family = AF_INET6;
  int rc = ::getaddrinfo(all ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0 && all) {  // no IPv6: IPv4
    hints.ai_family = AF_INET;
    rc = ::getaddrinfo(nullptr, port_text.c_str(), &hints, &res);
  }
  if (rc != 0) return SP_STATUS(StatusCode::kCommError, "cannot resolve " + host + ": " + gai_strerror(rc));
  const int one = 1, zero = 0;
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6 && all) (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0)
    return SP_STATUS(StatusCode::kCommError,
                     "cannot listen on " + (all ? std::string("*") : host) + ":" + port_text + ": " + why);
  return fd;
}

StatusOr<int> tcp_bound_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return SP_STATUS(StatusCode::kCommError, std::string("getsockname failed: ") + std::strerror(errno));
  return a.ss_family == AF_INET6 ? int(ntohs(reinterpret_cast<sockaddr_in6&>(a).sin6_port))
                                 : int(ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port));
}

StatusOr<int> tcp_connect(const std::string& host, int port, TcpClock::time_point deadline) {
  std::string why = "no address";
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) why = gai_strerror(rc);
    for (addrinfo* a = rc == 0 ? res : nullptr; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        return fd;
      }
      why = std::strerror(errno);
      ::close(fd);
    }
    if (rc == 0) ::freeaddrinfo(res);
    if (TcpClock::now() >= deadline)
      return SP_STATUS(StatusCode::kCommError,
                       "could not connect to " + host + ":" + std::to_string(port) + " in time: " + why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status tcp_send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return SP_STATUS(StatusCode::kCommError, std::string("send failed: ") + std::strerror(errno));
    p += w, n -= size_t(w);
  }
  return Status::Ok();
}

Status tcp_recv_all(int fd, void* data, size_t n, TcpClock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - TcpClock::now()).count();
    if (left <= 0) return SP_STATUS(StatusCode::kCommError, "timed out waiting for the peer");
    pollfd f{fd, POLLIN, 0};
    if (::poll(&f, 1, int(std::min<int64_t>(left, 1000))) <= 0) continue;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return SP_STATUS(StatusCode::kCommError, "the peer closed the connection");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return SP_STATUS(StatusCode::kCommError, std::string("recv failed: ") + std::strerror(errno));
    }
    p += r, n -= size_t(r);
  }
  return Status::Ok();
}

std::string tcp_local_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? numeric_address(a) : std::string();
}

std::string tcp_peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? numeric_address(a) : std::string();
}

Status tcp_make_data_socket(int fd) {
  const int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return SP_STATUS(StatusCode::kCommError, std::string("fcntl failed: ") + std::strerror(errno));
  return Status::Ok();
}

}  // namespace seqpar
