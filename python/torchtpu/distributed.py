"""torch.distributed on tpu tensors: the c10d backend "pjrt".

`import torchtpu` registers it for the "tpu" device, so `init_process_group()`
with no backend, `init_process_group("pjrt")` and `"cpu:gloo,tpu:pjrt"` all
give tpu tensors this backend (CPU tensors keep gloo). It is a Python c10d
backend (PyTorch's PyBackend trampoline, as `torch.distributed._nccl4py`).

On torch before 2.15 (2.11: the GPU images'), whose c10d neither lets Python
subclass its Backend nor hands a backend's creator its group, the same
backend is a plain Python object carried by the adapter's c10d Backend
(csrc/python_backend.cpp), and the group is the one the creator's caller is
making. There a group that names gloo alone ("gloo", "cpu:gloo") carries CPU
tensors only: 2.11 makes gloo groups inline, with no creator to wrap.

MPMD by construction: a rank's own programs never contain a cross-rank op.
A collective first runs what fused mode has recorded (reading the inputs
does), then runs on its own, so ranks may run different code, shapes and
host reads between collectives. Before each collective's transfer the
members exchange a descriptor (sequence number, collective, dtype, sizes,
root, reduce op); a difference raises the same error on every rank, and a
missing collective runs into the group's timeout instead of hanging.

Transport, chosen by platform:
- On GPUs and TPUs, all_reduce, broadcast, all_gather_into_tensor,
  reduce_scatter_tensor and all_to_all_single (even splits) are each one
  XLA program over the group's devices (`torchtpu::collective`: NCCL or ICI
  inside it). The default group's creation makes each process's PJRT client
  for the whole group (`_C.join`, its processes meeting through the group's
  store). The other collectives (list forms, reduce, gather, scatter,
  uneven all_to_all, send/recv) go through gloo on host copies.
- On the CPU plugin everything goes through PyTorch's gloo. Device memory is
  the host's there, so gloo works in place on a tensor's buffer when nothing
  else holds it (an all_reduce of DDP's buckets); otherwise on host copies,
  each result written back as the tensor's new value.
"""
import collections
import ctypes
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllreduceOptions,
    AllToAllOptions,
    Backend as C10DBackend,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _DistributedBackendOptions,
)

from . import _C, _plugin

NAME = "pjrt"
# Whether this torch takes Python backends as they are (2.15), see above.
NATIVE = hasattr(_DistributedBackendOptions(), "process_group")
# The global id of each process's device, by rank in the default group (`_C.join`).
_world_devices = []

_COLLECTIVES = ["broadcast", "allreduce", "reduce", "allgather", "all_gather_single", "gather", "scatter",
                "reduce_scatter", "reduce_scatter_single", "all_to_all_single", "alltoall", "barrier",
                "send", "recv"]
# A check's descriptor: sequence number, collective, dtype, elements, tensors, root,
# reduce op, dimensions, the first 4 sizes.
_DESCRIPTOR = 12
# torch.distributed's reduce ops as the collective programs name them.
_PROGRAM_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "product", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
                ReduceOp.AVG: "avg", ReduceOp.PREMUL_SUM: "premul_sum"}
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool]


class _Done(dist._Work):
    """A collective's Work: the transport has finished by the time it is made.
    (`is_completed()` still reads False: PyTorch's holder of Python Works does
    not forward it.)"""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def result(self):
        return self._result

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


_done = _Done


class _Pending(dist._Work):
    """A point-to-point transfer still under way in gloo: `wait` waits for it,
    then `finish` (a received value written into its tpu tensor). Sends and
    receives are asynchronous, as PyTorch's isend/irecv require: two ranks
    that both send first (a pipeline's batch_isend_irecv) must not block."""

    def __init__(self, work, tensors, finish=None):
        super().__init__()
        self._work, self._tensors, self._finish = work, tensors, finish

    def wait(self, timeout=None):
        if self._work is not None:
            self._work.wait()
            self._work = None
            if self._finish is not None:
                self._finish()
        return True

    def is_completed(self):
        return self._work is None or self._work.is_completed()

    def is_success(self):
        return True

    def result(self):
        return self._tensors

    def get_future(self):
        self.wait()
        return _Done(self._tensors).get_future()


class _SentToSelf:
    """What a rank sent itself under one tag, as the transfer its receive
    waits on (NCCL takes sends to oneself; gloo has no pair for them)."""

    def __init__(self, queue):
        self.queue = queue

    def wait(self):
        if not self.queue:
            raise RuntimeError("torchtpu: a receive from this rank itself, with no send to it before its wait")

    def is_completed(self):
        return bool(self.queue)


class _Staging:
    """Host tensors handed to gloo. Copies of tpu tensors reuse buffers
    across collectives (a fresh large allocation costs a page fault per
    4 KiB at each call); within one collective every copy gets its own
    buffer. Bounded; the oldest go first.

    Each tensor handed to gloo is also held by a C++ reference until the
    next collective. gloo's worker thread drops its own reference after the
    Work completes; were that the last one besides Python's, it would take
    the GIL to release the Python object, and a process exiting right after
    its last collective would abort ("terminate called without an active
    exception", PyTorch's issue #190489)."""

    LIMIT = 512 << 20

    def __init__(self):
        self._buffers = {}
        self._taken = {}
        self._pins = []
        self._transfers = collections.deque(maxlen=32)

    def begin(self):
        """A new collective: every buffer is free again."""
        self._taken.clear()
        self._pins.clear()

    def pin(self, tensors):
        """`tensors`, held until the next collective (see above)."""
        tensors = list(tensors)
        if tensors:
            self._pins.append(torch._C.ScriptList(tensors))
        return tensors

    def hold(self, tensors):
        """`tensors` of a point-to-point transfer, held from C++ for the next
        32 transfers (see above), whatever collectives run meanwhile."""
        tensors = list(tensors)
        self._transfers.append(torch._C.ScriptList(tensors))
        return tensors

    def empty(self, shape, dtype):
        return self.pin([torch.empty(shape, dtype=dtype)])[0]

    def copies(self, tensors):
        """Host copies of tpu tensors (reading them runs what fused mode recorded)."""
        out = []
        for t in tensors:
            shape = (t.dtype, tuple(t.shape))
            n = self._taken[shape] = self._taken.get(shape, -1) + 1
            buf = self._buffers.pop((shape, n), None)
            if buf is None:
                buf = torch.empty(t.shape, dtype=t.dtype)
            buf.copy_(t.detach())
            self._buffers[(shape, n)] = buf
            out.append(buf)
        while sum(b.nbytes for b in self._buffers.values()) > self.LIMIT and len(self._buffers) > len(out):
            del self._buffers[next(iter(self._buffers))]
        return self.pin(out)


def _write(tensors, values):
    """Each result becomes its tensor's new value."""
    with torch.no_grad():
        for t, v in zip(tensors, values):
            t.copy_(v)


class _Members:
    """What c10d's Backend gives its Python subclasses on 2.15, for torch
    before it (see above)."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


class TpuBackend(C10DBackend if NATIVE else _Members):
    """The c10d backend of tpu tensors. `devices`: the global device id of each
    member, in rank order, where collectives run as XLA programs; None where
    gloo carries them (the CPU plugin). `gloo`: a gloo backend of the same
    members to use (else one of its own over `store`)."""

    def __init__(self, store, rank, size, timeout, devices=None, options=None, gloo=None):
        super().__init__(rank, size)
        self._devices = devices
        self._options = options or C10DBackend.Options(NAME, timeout=timeout)
        self._gloo = gloo or dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._seq = 0
        self._staging = _Staging()
        self._host = self._staging.copies
        # The descriptors sent and received by every check, made once (and
        # held from C++: see _Staging).
        self._descriptors = torch._C.ScriptList([torch.zeros(size * _DESCRIPTOR, dtype=torch.int64)
                                                 for _ in range(2)])
        self._mine, self._theirs = self._descriptors
        self._mine_rows = self._mine.numpy().reshape(size, _DESCRIPTOR)
        self._exchange = None
        self._to_self = collections.defaultdict(collections.deque)  # by tag: what this rank sent itself

    @property
    def options(self):
        return self._options

    # What the backend offers beyond the collectives. Declared here: c10d's
    # Python trampoline looks each one up on this class, and inherited ones
    # call back into it without end (a RecursionError in init_process_group's
    # device_id, and in batch_isend_irecv's coalescing).
    supports_splitting = True  # split_group, pipelining's edge groups (`split`)
    supports_coalescing = False  # coalesced calls run one by one
    supports_shrinking = False
    supports_reconfigure = False
    supports_window = False
    _supports_time_estimate = False

    def split(self, store, ranks, opts):
        """This group's members `ranks` (group ranks, in the new group's order)
        as a backend of their own, for `split_group`; None on other ranks.
        Made anew over `store`: nothing is shared with this one."""
        ranks = list(ranks)
        if self.rank() not in ranks:
            return None
        devices = None if self._devices is None else [self._devices[r] for r in ranks]
        timeout = opts._timeout if opts is not None else self._options._timeout
        return TpuBackend(dist.PrefixStore("tpu/", store), ranks.index(self.rank()), len(ranks), timeout,
                          devices, opts)

    def perform_nocolor_split(self, device):
        """What `new_group` asks of a rank left out of a group split from this
        one (NCCL's collective split); groups here are made anew: nothing to do."""

    def getBackendName(self):
        return NAME

    # -------------------------------------------------------------- checks

    def _check(self, collective, tensors=(), root=-1, op=None, sized=True):
        """Sends this call's descriptor to the group's members; the returned
        function, called before the collective's own transfer, raises on
        every rank if they differ. Meanwhile each member gets its inputs
        ready (runs what it recorded). `sized=False`: members may
        legitimately pass different sizes (all-to-all's splits).

        The exchange is gloo's all-to-all, one message between each pair of
        members (its allgather takes a round per member)."""
        if self._exchange is not None:  # an earlier check's, left by an error before it was awaited
            self._exchange.wait()
        self._seq += 1
        self._staging.begin()
        first = tensors[0] if tensors else None
        sizes = list(first.shape)[:4] if first is not None and sized else []
        self._mine_rows[:] = [self._seq, _COLLECTIVES.index(collective),
                              _DTYPES.index(first.dtype) if first is not None and first.dtype in _DTYPES else -1,
                              sum(t.numel() for t in tensors) if sized else -1, len(tensors), root,
                              int(op.op) if op is not None else -1, len(sizes)] + sizes + [0] * (4 - len(sizes))
        self._exchange = self._gloo.alltoall_base(self._theirs, self._mine, [], [], AllToAllOptions())

        def agreed():
            self._exchange.wait()
            self._exchange = None
            flat = self._theirs.tolist()
            calls = [flat[r * _DESCRIPTOR:(r + 1) * _DESCRIPTOR] for r in range(self.size())]
            if any(c != calls[0] for c in calls):
                described = "; ".join(f"rank {r}: {self._describe(c)}" for r, c in enumerate(calls))
                raise RuntimeError(f"torchtpu: collectives do not match across the group: {described}")

        return agreed

    @staticmethod
    def _describe(d):
        seq, coll, dtype, numel, count, root, op, ndim = d[:8]
        what = f"{_COLLECTIVES[coll]} #{seq}"
        if dtype >= 0:
            what += f" of {count} {str(_DTYPES[dtype]).removeprefix('torch.')} tensor(s)"
        if numel >= 0:
            what += f", sizes {d[8:8 + ndim]}, {numel} elements"
        if root >= 0:
            what += f", root {root}"
        if op >= 0:
            what += f", {ReduceOp.RedOpType(op).name}"
        return what

    # -------------------------------------------------------------- reductions

    def _program(self, kind, inputs, outputs, reduce_op=None, root=0):
        """Runs the collective as one XLA program over the group's devices, per
        tensor (GPUs and TPUs: `self._devices` set)."""
        op, scale = "sum", 1.0
        if reduce_op is not None:
            op = _PROGRAM_OPS[reduce_op.op]
            if reduce_op.op == ReduceOp.PREMUL_SUM:
                scale = float(_factor(reduce_op))
        for i, o in zip(inputs, outputs):
            torch.ops.torchtpu.collective(kind, op, scale, root, [], self._devices, [i], [o])

    @staticmethod
    def _premul(values, reduce_op):
        """Scales PREMUL_SUM's values in place before gloo sums them (gloo has
        neither PREMUL_SUM nor AVG)."""
        if reduce_op.op == ReduceOp.PREMUL_SUM:
            factor = _factor(reduce_op)
            factor = factor.to("cpu") if isinstance(factor, torch.Tensor) else factor
            for v in values:
                v.mul_(factor)

    def _average(self, values, reduce_op):
        """Turns gloo's sums into AVG's means, in place (integers truncated, as
        the collective programs do)."""
        if reduce_op.op == ReduceOp.AVG:
            for v in values:
                v.div_(self.size(), rounding_mode=None if v.is_floating_point() else "trunc")

    @staticmethod
    def _gloo_op(reduce_op):
        """gloo's op for `reduce_op`: AVG and PREMUL_SUM are sums (see `_premul`)."""
        return ReduceOp.SUM if reduce_op.op in (ReduceOp.AVG, ReduceOp.PREMUL_SUM) else reduce_op.op

    def _in_place_or_copies(self, tensors, access="read_write"):
        """(host tensors for gloo, whether they are copies to write back): CPU
        tensors over the tpu tensors' own memory where gloo may use it in place
        (the CPU plugin, where that memory is the host's; `torchtpu::host_alias`
        says when, for `access`: "read_write", "read" or "write"), else host
        copies (for "write", host buffers of their shape)."""
        views = []
        for t in tensors:
            address = torch.ops.torchtpu.host_alias(t, access) if t.numel() else 0
            if not address:
                if access == "write":
                    return [self._staging.empty(t.shape, t.dtype) for t in tensors], True
                return self._host(tensors), access != "read"
            memory = (ctypes.c_char * t.nbytes).from_address(address)
            views.append(torch.frombuffer(memory, dtype=t.dtype).view(t.shape))
        return self._staging.pin(views), False

    # -------------------------------------------------------------- collectives

    def broadcast(self, tensor_list, opts):
        agreed = self._check("broadcast", tensor_list, root=opts.rootRank)
        if self._devices is not None:
            agreed()
            self._program("broadcast", tensor_list, tensor_list, root=opts.rootRank)
            return _done(tensor_list)
        host, copied = self._in_place_or_copies(tensor_list)
        agreed()
        self._gloo.broadcast(host, self._opts(BroadcastOptions(), rootRank=opts.rootRank)).wait()
        if copied:
            _write(tensor_list, host)
        return _done(tensor_list)

    def allreduce(self, tensor_list, opts):
        agreed = self._check("allreduce", tensor_list, op=opts.reduceOp)
        if self._devices is not None:
            agreed()
            self._program("all_reduce", tensor_list, tensor_list, opts.reduceOp)
            return _done(tensor_list)
        host, copied = self._in_place_or_copies(tensor_list)
        agreed()
        self._premul(host, opts.reduceOp)
        self._gloo.allreduce(host, self._opts(AllreduceOptions(), reduceOp=self._gloo_op(opts.reduceOp))).wait()
        self._average(host, opts.reduceOp)
        if copied:
            _write(tensor_list, host)
        return _done(tensor_list)

    def allreduce_coalesced(self, tensor_list, opts):
        for t in tensor_list:
            self.allreduce([t], opts)
        return _done(tensor_list)

    def reduce(self, tensor_list, opts):
        agreed = self._check("reduce", tensor_list, root=opts.rootRank, op=opts.reduceOp)
        host = self._host(tensor_list)
        agreed()
        self._premul(host, opts.reduceOp)
        gloo_opts = self._opts(ReduceOptions(), rootRank=opts.rootRank, reduceOp=self._gloo_op(opts.reduceOp))
        self._gloo.reduce(host, gloo_opts).wait()
        if self.rank() == opts.rootRank:
            self._average(host, opts.reduceOp)
            _write(tensor_list, host)
        return _done(tensor_list)

    def allgather(self, output_tensors, input_tensors, opts):
        agreed = self._check("allgather", input_tensors)
        outs = [self._host(o) for o in output_tensors]
        ins = self._host(input_tensors)
        agreed()
        self._gloo.allgather(outs, ins).wait()
        for o, h in zip(output_tensors, outs):
            _write(o, h)
        return _done(output_tensors)

    def all_gather_single(self, output, input, opts):
        agreed = self._check("all_gather_single", [input])
        if self._devices is not None:
            agreed()
            self._program("all_gather", [input.reshape(-1)], [output.view(-1)])
            return _done([output])
        (inp,), _ = self._in_place_or_copies([input], "read")
        (out,), copied = self._in_place_or_copies([output], "write")
        agreed()
        self._gloo._allgather_base(out, inp).wait()
        if copied:
            _write([output], [out])
        return _done([output])

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return _done(outputs)

    def gather(self, output_tensors, input_tensors, opts):
        agreed = self._check("gather", input_tensors, root=opts.rootRank)
        outs = [self._host(o) for o in output_tensors]
        ins = self._host(input_tensors)
        agreed()
        self._gloo.gather(outs, ins, self._opts(GatherOptions(), rootRank=opts.rootRank)).wait()
        for o, h in zip(output_tensors, outs):
            _write(o, h)
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        agreed = self._check("scatter", output_tensors, root=opts.rootRank)
        outs = self._host(output_tensors)
        ins = [self._host(i) for i in input_tensors]
        agreed()
        self._gloo.scatter(outs, ins, self._opts(ScatterOptions(), rootRank=opts.rootRank)).wait()
        _write(output_tensors, outs)
        return _done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        agreed = self._check("reduce_scatter", output_tensors, op=opts.reduceOp)
        outs = self._host(output_tensors)
        ins = [self._host(i) for i in input_tensors]
        agreed()
        for i in ins:
            self._premul(i, opts.reduceOp)
        gloo_opts = self._opts(ReduceScatterOptions(), reduceOp=self._gloo_op(opts.reduceOp))
        self._gloo.reduce_scatter(outs, ins, gloo_opts).wait()
        self._average(outs, opts.reduceOp)
        _write(output_tensors, outs)
        return _done(output_tensors)

    def reduce_scatter_single(self, output, input, opts):
        agreed = self._check("reduce_scatter_single", [output], op=opts.reduceOp)
        if self._devices is not None:
            agreed()
            self._program("reduce_scatter", [input.reshape(-1)], [output.view(-1)], opts.reduceOp)
            return _done([output])
        inp = self._host([input])  # gloo and PREMUL_SUM may change it
        (out,), copied = self._in_place_or_copies([output], "write")
        agreed()
        self._premul(inp, opts.reduceOp)
        gloo_opts = self._opts(ReduceScatterOptions(), reduceOp=self._gloo_op(opts.reduceOp))
        self._gloo._reduce_scatter_base(out, inp[0], gloo_opts).wait()
        self._average([out], opts.reduceOp)
        if copied:
            _write([output], [out])
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, opts)
        return _done(outputs)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        agreed = self._check("all_to_all_single", [input], sized=False)
        if self._devices is not None and not output_split_sizes and not input_split_sizes:
            agreed()
            self._program("all_to_all", [input.reshape(-1)], [output.view(-1)])
            return _done([output])
        (inp,), _ = self._in_place_or_copies([input], "read")
        (out,), copied = self._in_place_or_copies([output], "write")
        agreed()
        self._gloo.alltoall_base(out, inp, output_split_sizes, input_split_sizes, AllToAllOptions()).wait()
        if copied:
            _write([output], [out])
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts):
        """As one all_to_all_single of the tensors flattened and joined (gloo
        before torch 2.15 has no list form)."""
        agreed = self._check("alltoall", input_tensors, sized=False)
        ins = self._staging.pin([torch.cat([h.reshape(-1) for h in self._host(input_tensors)])])[0]
        out = self._staging.empty(sum(t.numel() for t in output_tensors), ins.dtype)
        agreed()
        self._gloo.alltoall_base(out, ins, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors],
                                 AllToAllOptions()).wait()
        _write(output_tensors, [o.view(t.shape) for o, t in zip(out.split([t.numel() for t in output_tensors]),
                                                                 output_tensors)])
        return _done(output_tensors)

    def barrier(self, opts):
        agreed = self._check("barrier")
        torch.tpu.synchronize()
        agreed()
        return _done(None)

    # Point-to-point: no group-wide descriptor (the other members take no
    # part), and host buffers of their own (not the staging's, which the
    # next collective reuses while a transfer may still be under way).

    def send(self, tensor_list, dst, tag=0):
        if dst == self.rank():
            self._to_self[tag].append([t.detach().clone() for t in tensor_list])
            return _done(tensor_list)
        host = self._staging.hold(t.detach().to("cpu") for t in tensor_list)
        return _Pending(self._gloo.send(host, dst, tag), tensor_list)

    def recv(self, tensor_list, src, tag=0):
        if src == self.rank():
            sent = _SentToSelf(self._to_self[tag])
            return _Pending(sent, tensor_list, lambda: _write(tensor_list, sent.queue.popleft()))
        host = self._staging.hold(torch.empty(t.shape, dtype=t.dtype) for t in tensor_list)
        return _Pending(self._gloo.recv(host, src, tag), tensor_list, lambda: _write(tensor_list, host))

    @staticmethod
    def _opts(options, **fields):
        for k, v in fields.items():
            setattr(options, k, v)
        return options


def create(opts, backend_options, gloo=None):
    """The creator `torch.distributed.Backend.register_backend` calls. A group
    made without naming a CPU backend (`init_process_group()`: PyTorch then
    picks the accelerator's only) takes CPU tensors too, through the same gloo.
    `gloo`: the group's own gloo backend, which this one then shares."""
    group, cpu, tpu = opts.process_group if NATIVE else _group_being_made(), torch.device("cpu"), torch.device("tpu")
    made = _backend_of(group, tpu)
    if isinstance(made, TpuBackend):  # "cpu:gloo,tpu:pjrt": gloo's creator made it first
        return made
    timeout = opts.timeout if opts.timeout is not None else datetime.timedelta(minutes=30)
    # A gloo group on the CPU plugin leaves the runtime unstarted, so that a
    # CPU-only script's gloo costs what it did: there gloo carries tpu tensors
    # anyway, and joining would only check that the processes run one platform.
    on_gloo_alone = gloo is not None and _plugin.find_plugin()[1]
    global _world_devices
    if not dist.is_initialized() and not on_gloo_alone:  # the default group: this process's runtime joins it
        local = int(os.environ.get("LOCAL_RANK", opts.group_rank))
        _world_devices = _C.join(dist.PrefixStore("torchtpu/", opts.store), opts.group_rank, opts.group_size,
                                 local, timeout.total_seconds(), _plugin.spans_processes())
    devices = None
    if not on_gloo_alone and _C.platform()[0] != "cpu":
        ranks = list(opts.global_ranks_in_group) or range(opts.group_size)
        devices = [_world_devices[r] for r in ranks]
    backend = TpuBackend(opts.store, opts.group_rank, opts.group_size, timeout, devices, gloo=gloo)
    if group is not None and _backend_of(group, cpu) is None:
        group._register_backend(cpu, dist.ProcessGroup.BackendType.GLOO, backend._gloo)
    return backend if NATIVE else _C.python_backend(backend)


def create_gloo(gloo_creator, opts, backend_options):
    """torch's gloo backend for a group that names gloo (`"gloo"`,
    `"cpu:gloo"`), and, where no other backend is named for tpu, this module's
    backend over it for tpu tensors: gloo carries tpu tensors as it carries
    CUDA tensors (DDP, Lightning and scripts pick gloo for any device but CUDA)."""
    gloo = gloo_creator(opts, backend_options)
    group, tpu = opts.process_group, torch.device("tpu")
    if group is not None and _backend_of(group, tpu) is None:
        group._register_backend(tpu, dist.ProcessGroup.BackendType.CUSTOM, create(opts, None, gloo))
    return gloo


def refuse_nccl(opts, backend_options):
    """The creator of "nccl" in a process that uses tpu (CUDA is refused there)."""
    raise RuntimeError(
        "torchtpu: the c10d backend 'nccl' carries CUDA tensors only, and this process's accelerator is tpu. "
        "For tpu tensors, init_process_group() with no backend, 'pjrt' (on GPUs its collectives run NCCL "
        "inside XLA programs), 'gloo', or 'cpu:gloo,tpu:pjrt'.")


def _backend_of(group, device):
    """`group`'s backend for `device`'s type (ours as the Python object), None
    if it has none."""
    if group is None or device.type not in {d.type for d in group._device_types}:
        return None
    backend = group._get_backend(device)
    carried = _C.python_backend_impl(backend)  # before 2.15: ours, as its Python object
    return backend if carried is None else carried


def _factor(reduce_op):
    """PREMUL_SUM's factor (2.11's ReduceOp shows it to the adapter only)."""
    return reduce_op.factor if NATIVE else _C.premul_factor(reduce_op)


def _group_being_made():
    """The group that torch 2.11's `_new_process_group_helper`, a creator's
    caller, is making (its `pg`); None where no such caller is found."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_new_process_group_helper":
        frame = frame.f_back
    group = frame.f_locals.get("pg") if frame is not None else None
    return group if isinstance(group, dist.ProcessGroup) else None
