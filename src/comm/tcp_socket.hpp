// Plain TCP socket helpers shared by the bootstrap (tcp_bootstrap.cpp) and the tcp communicator
// (tcp_communicator.cpp): listening, connecting with retries, whole-buffer sends and receives
// with a deadline, and the numeric addresses of a connection's two ends.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "seqpar/status.hpp"

namespace seqpar {

using TcpClock = std::chrono::steady_clock;

// A listening socket on host:port ("" or "*": every interface, IPv6 dual-stack where there is;
// port 0: one the kernel picks).
StatusOr<int> tcp_listen(const std::string& host, int port, int backlog);
// The port a listening socket is bound to.
StatusOr<int> tcp_bound_port(int fd);
// Connects to host:port, retrying every 100 ms until `deadline` (the listener may not be up yet).
StatusOr<int> tcp_connect(const std::string& host, int port, TcpClock::time_point deadline);
// Sends all n bytes (blocking socket).
Status tcp_send_all(int fd, const void* data, size_t n);
// Receives exactly n bytes on a blocking socket, or fails at `deadline` or when the peer closes.
Status tcp_recv_all(int fd, void* data, size_t n, TcpClock::time_point deadline);
// The numeric address of this end (local) or the other end (peer) of a connected socket.
std::string tcp_local_address(int fd);
std::string tcp_peer_address(int fd);
// Turns off Nagle's algorithm and makes the socket non-blocking (the communicator's data path).
Status tcp_make_data_socket(int fd);

}  // namespace seqpar
