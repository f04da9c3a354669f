// The TCP bootstrap's handshake (src/comm/tcp_bootstrap.hpp), on loopback: rank 0 serves the
// ranks of its world each once while strangers come and go: one that connects and sends nothing,
// one that sends an HTTP request, one with another job's token, one with a rank outside the
// world, and a second "rank 1". None of them gets the bytes or delays the real ranks, and the
// ones that speak the protocol are told why they were refused.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "comm/tcp_bootstrap.hpp"

namespace seqpar {
namespace {

// A raw client: connects to 127.0.0.1:port (retrying while the server starts), sends `bytes`.
int raw_connect(int port, const std::string& bytes) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      return fd;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}
std::string read_all(int fd) {
  std::string got;
  char buf[256];
  for (ssize_t r; (r = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, size_t(r));
  return got;
}

TEST(Bootstrap, RanksAreServedOnceAndStrangersGetNothing) {
  const std::string id = "the-nccl-unique-id-0123456789";
  const int port = 20000 + int(std::random_device{}() % 30000);
  const BootstrapPeer root{"job-42", 0, 3};
  Status served = Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  std::thread server([&] { served = serve_bytes(id.data(), id.size(), "127.0.0.1", port, root); });

  const int silent = raw_connect(port, "");  // a port probe that never speaks
  ASSERT_GE(silent, 0) << "the server did not listen on " << port;
  const int http = raw_connect(port, "GET / HTTP/1.0\r\n\r\n");
  const std::string http_reply = read_all(http);
  ::close(http);
  EXPECT_EQ(http_reply.find(id), std::string::npos);
  EXPECT_EQ(http_reply.rfind("R", 0), 0u) << http_reply;

  std::string got(id.size(), '\0');
  const Status wrong_token = fetch_bytes("127.0.0.1", port, got.data(), got.size(), {"job-7", 1, 3});
  EXPECT_EQ(wrong_token.code(), StatusCode::kCommError);
  EXPECT_NE(wrong_token.message().find("another job's token"), std::string::npos) << wrong_token.message();
  const Status outside = fetch_bytes("127.0.0.1", port, got.data(), got.size(), {"job-42", 5, 3});
  EXPECT_NE(outside.message().find("not a rank of this world"), std::string::npos) << outside.message();
  EXPECT_EQ(got, std::string(id.size(), '\0'));  // the refused learnt nothing

  ASSERT_TRUE(fetch_bytes("127.0.0.1", port, got.data(), got.size(), {"job-42", 1, 3}).ok());
  EXPECT_EQ(got, id);
  const Status again = fetch_bytes("127.0.0.1", port, got.data(), got.size(), {"job-42", 1, 3});
  EXPECT_NE(again.message().find("served already"), std::string::npos) << again.message();
  std::string second(id.size(), '\0');
  ASSERT_TRUE(fetch_bytes("127.0.0.1", port, second.data(), second.size(), {"job-42", 2, 3}).ok());
  EXPECT_EQ(second, id);
  server.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(served.ok()) << served.to_string();
  EXPECT_LT(seconds, 4.0) << "the silent stranger held rank 0 up";  // below the 5 s hello wait
  EXPECT_TRUE(read_all(silent).find(id) == std::string::npos);
  ::close(silent);
}

}  // namespace
}  // namespace seqpar
