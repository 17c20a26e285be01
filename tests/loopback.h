// A loopback client socket for the tests that talk to a server byte by byte (tests/server, tests/cli).
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cstdint>

namespace dc::testing {

// A socket connected to 127.0.0.1:port (a failed connect fails the test); no receive waits longer than
// `timeout_s`. A `receive_buffer_bytes` above 0 sets SO_RCVBUF before the connect (a small one keeps what
// a client that never reads holds small).
inline int connect_to(int port, int timeout_s = 20, int receive_buffer_bytes = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (receive_buffer_bytes > 0) {
    EXPECT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes)), 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

}  // namespace dc::testing
