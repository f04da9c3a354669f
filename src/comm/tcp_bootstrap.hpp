// A small TCP exchange for bootstrapping processes that share no launcher channel (torchrun):
// rank 0 serves a few bytes (NCCL's unique id) to every other rank, which fetches them from
// MASTER_ADDR. Each rank opens with a hello (a magic, the job's token, its rank and the world
// size); rank 0 serves each expected rank once and refuses strangers (nothing sent, junk, a wrong
// token, a rank out of range or already served) with a log line, without waiting on them. Both
// sides give up after comm_timeout() with a message that says what was missing.
#pragma once

#include <cstddef>
#include <string>

#include "seqpar/status.hpp"

namespace seqpar {

struct BootstrapPeer {
  std::string token;  // the job's secret: SEQPAR_JOB_TOKEN, else TORCHELASTIC_RUN_ID, else empty
  int rank = 0;
  int world = 1;
};
// This process's identity from the launcher's environment (RANK, WORLD_SIZE and the token).
BootstrapPeer bootstrap_peer_from_env();
// Whether every address host resolves to is a loopback one (127.x, ::1).
bool is_loopback_host(const std::string& host);
// Where rank 0 listens under torchrun: MASTER_ADDR's address alone, unless told to listen on
// every interface (SEQPAR_BOOTSTRAP_LISTEN_ALL=1), or unless MASTER_ADDR names this host's
// loopback while the job spans nodes (`hostname` often resolves to 127.0.1.1), which no other
// node could reach ("*" then). Warns when the job has no token.
std::string bootstrap_listen_host(const std::string& master, const BootstrapPeer& me);
// The bootstrap's port: SEQPAR_BOOTSTRAP_PORT, else MASTER_PORT + 1 (torchrun's own store holds
// MASTER_PORT).
int bootstrap_port();

// Rank 0: listens on host:port (host "" or "*": every interface) until every other rank of
// me.world with me.token has taken `bytes`.
Status serve_bytes(const void* data, size_t bytes, const std::string& host, int port, const BootstrapPeer& me);
// Another rank: connects to host:port, retrying while rank 0 is not yet listening, says who it
// is, and reads `bytes`. A refusal by rank 0 (a wrong token, a rank served already) ends it with
// rank 0's reason.
Status fetch_bytes(const std::string& host, int port, void* data, size_t bytes, const BootstrapPeer& me);

}  // namespace seqpar
