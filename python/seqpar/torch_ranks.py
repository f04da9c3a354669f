"""The ranks seqpar.torch computes on, kept between calls (each holds a communicator, GPU state
and cached plans):

- a torch.distributed group with CPU tensors: a communicator whose transport is the group's
  own point-to-point (gloo isend/irecv; `GroupTransport`), so CPU runs need no MPI;
- a torch.distributed group with CUDA tensors: seqpar's NCCL communicator, its unique id handed
  from the group's rank 0 to the others through the group's c10d store;
- no group: thread ranks of this process over the local communicator (CPU, or sharing a GPU).

A rank whose call failed is dropped, so the next call starts a fresh communicator.
"""
from __future__ import annotations

import atexit
import datetime
import os
import threading
from typing import Dict, List, Tuple

import torch

from . import _core

__all__ = ["GroupTransport", "group_rank", "thread_ranks", "forget"]

_TAG = 0x5E9  # seqpar's messages on a group, apart from the user's own tag 0 traffic
_lock = threading.Lock()
_group_ranks: Dict[Tuple[str, str], "_core.Rank"] = {}
_thread_ranks: Dict[Tuple[int, str], List["_core.Rank"]] = {}
_nccl_generation: Dict[str, int] = {}


class _Batch:
    """A batch of isend/irecv works; wait() completes them or raises (timeout, dead peer)."""

    def __init__(self, works):
        self.works = works

    def wait(self, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        for w in self.works:
            if not w.wait(timeout=timeout):
                raise RuntimeError(f"a transfer did not complete within {timeout_s:.0f} s (SEQPAR_COMM_TIMEOUT_S)")


class GroupTransport:
    """seqpar's point-to-point batches over a torch.distributed group's host transport (gloo).
    Peers are ranks within the group; buffers are numpy views of seqpar's memory."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist = dist
        self.group = group
        self.peers = [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))]

    def post(self, sends, recvs):
        dist = self.dist
        works = []
        for peer, buf in recvs:  # receives first, each pair's messages in posting order
            if buf.size:
                works.append(dist.irecv(torch.from_numpy(buf), src=self.peers[peer], group=self.group, tag=_TAG))
        for peer, buf in sends:
            if buf.size:
                works.append(dist.isend(torch.from_numpy(buf), dst=self.peers[peer], group=self.group, tag=_TAG))
        return _Batch(works)


def _timeout_s() -> float:
    """SEQPAR_COMM_TIMEOUT_S, as the C++ communicators read it (default 300 s)."""
    try:
        value = float(os.environ.get("SEQPAR_COMM_TIMEOUT_S", "300"))
    except ValueError:
        value = 300.0
    return value if value > 0 else 300.0


def _group_key(group) -> str:
    # The name, and the object: a group destroyed and made again may reuse its name (the
    # cached rank holds the old object, so its id is not reused).
    return f"{getattr(group, 'group_name', '')}#{id(group)}"


def _nccl_rank(group, key: str, device: torch.device):
    """Our NCCL communicator over the group's processes: rank 0 makes the id and puts it in the
    group's store; every rank reads it and joins."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    if not _core.nccl_available():
        raise RuntimeError("this seqpar module has no NCCL (built without CUDA/NCCL); CUDA tensors over a "
                           "process group need it")
    try:
        store = c10d._get_process_group_store(group)
    except AttributeError:  # a torch without it: the default store, the key names the group
        store = c10d._get_default_store()
    gen = _nccl_generation.get(key, 0)
    _nccl_generation[key] = gen + 1
    store_key = f"seqpar/nccl_id/{key}/{gen}"
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank == 0:
        uid = _core.nccl_unique_id()
        store.set(store_key, uid)
    else:  # waits for rank 0, as long as a transfer may take
        store.wait([store_key], datetime.timedelta(seconds=_timeout_s()))
        uid = store.get(store_key)
    return _core.rank_from_nccl_id(bytes(uid), rank, size, device.index if device.index is not None else
                                   torch.cuda.current_device())


def group_rank(group, device: torch.device):
    """This process's seqpar rank over `group` for tensors on `device` (made on first use)."""
    import torch.distributed as dist
    key = (_group_key(group), str(device))
    with _lock:
        rank = _group_ranks.get(key)
        if rank is not None:
            return rank
    if device.type == "cuda":
        rank = _nccl_rank(group, getattr(group, "group_name", ""), device)
    else:
        backend = str(dist.get_backend(group))
        if "gloo" not in backend:
            raise ValueError(f"CPU tensors travel over the group's host transport, which needs gloo; this group's "
                             f"backend is {backend} (make one with torch.distributed.new_group(backend='gloo'))")
        rank = _core.rank_from_transport(GroupTransport(group), dist.get_rank(group), dist.get_world_size(group))
    with _lock:
        _group_ranks[key] = rank
    return rank


def thread_ranks(ranks: int, device: torch.device):
    """`ranks` thread ranks of this process (local communicator) for tensors on `device`."""
    key = (int(ranks), str(device))
    with _lock:
        found = _thread_ranks.get(key)
        if found is None:
            found = _thread_ranks[key] = _core.thread_ranks(int(ranks))
        return found


def forget(group, ranks: int, device: torch.device):
    """Drops the cached rank(s) after a failure (an aborted communicator does not recover)."""
    with _lock:
        if group is not None:
            _group_ranks.pop((_group_key(group), str(device)), None)
        else:
            _thread_ranks.pop((int(ranks), str(device)), None)


@atexit.register
def _release_all():
    """Destroys the ranks before the interpreter (and CUDA) shut down: NCCL communicators and
    device buffers must go while their device is still there."""
    with _lock:
        _group_ranks.clear()
        _thread_ranks.clear()
    # What other threads still hold (the cuDNN handles of PyTorch's autograd threads, which end
    # only after cuDNN's own teardown, where destroying them crashed) is left to the process's end.
    _core.abandon_device()
