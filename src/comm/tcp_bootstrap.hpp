// A small TCP exchange for bootstrapping processes that share no launcher channel (torchrun):
// rank 0 serves a few bytes (NCCL's unique id) to every other rank, which fetches them from
// MASTER_ADDR. Both give up after comm_timeout() with a message that says what was missing.
#pragma once

#include <cstddef>
#include <string>

#include "seqpar/status.hpp"

namespace seqpar {

// Listens on `port` (IPv6 dual-stack, else IPv4) until `clients` ranks have each taken `bytes`.
Status serve_bytes(const void* data, size_t bytes, int port, int clients);
// Connects to host:port, retrying while rank 0 is not yet listening, and reads `bytes`.
Status fetch_bytes(const std::string& host, int port, void* data, size_t bytes);

}  // namespace seqpar
