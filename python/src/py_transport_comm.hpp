// A Communicator whose transport is a Python object: the binding's way to run seqpar's schedules
// over torch.distributed (gloo) without PyTorch headers. post() hands each batch to
// transport.post(sends, recvs), with every buffer as a uint8 numpy array over seqpar's memory
// (no copy), and gets back a handle whose wait(timeout_s) completes the batch or raises.
// Python exceptions become kCommError statuses; the byte counters are the base class's.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "seqpar/comm.hpp"

namespace seqpar::py {

namespace nb = nanobind;

// transport: an object with post(sends, recvs) -> handle (sends, recvs: lists of (peer, array),
// receives first in posting order) and handle.wait(timeout_s); optionally abort(reason), called
// once when this rank gives up so that its peers can learn why. Host memory only.
std::unique_ptr<Communicator> make_python_transport_communicator(nb::object transport, int rank, int size);

}  // namespace seqpar::py
