"""The control channel: a ps or worker warns the chief before it goes away.

A preempted VM or pod gets SIGTERM and a grace period (GKE Spot pods ~15 s,
Spot VMs ~30 s) before it is killed. A ps that simply exits loses every step
since the last checkpoint; so on SIGTERM a ps/worker calls `Notice` on the
chief's control server and *stays up* until the chief answers that it has
saved a checkpoint (or the grace budget runs out), then exits 143.

Wire format: one unary gRPC method `/tfps.Control/Notice` (grpcio generic
handler, JSON bytes both ways), so no generated code is needed:
  request  {"task": "ps:0", "kind": "preemption", "deadline_seconds": 12.5}
  response {"saved": true, "step": 1200, "detail": "..."}

The control server listens on the chief's host at the chief's TF port + 1
unless told otherwise (`control_address`). With a standby chief only the
replica that coordinates serves it: a task tries each replica's, and the
other refuses at once (`send_to_chiefs`). It is unauthenticated like the TF
servers; the same firewall rules apply.
"""

import concurrent.futures
import dataclasses
import json
from typing import Callable, Sequence

import grpc

from tfps.cluster import spec as spec_lib

_METHOD = "/tfps.Control/Notice"
_SERVICE = "tfps.Control"


@dataclasses.dataclass(frozen=True)
class Notice:
  """A task's warning that it is about to go away."""

  task: str
  kind: str = "preemption"
  deadline_seconds: float = 10.0

  def __post_init__(self):
    spec_lib.TaskId.parse(self.task)  # Validates `job:index`.
    if self.deadline_seconds <= 0:
      raise ValueError(f"deadline_seconds ({self.deadline_seconds}) must be positive")


@dataclasses.dataclass(frozen=True)
class Reply:
  saved: bool
  step: int | None = None
  detail: str = ""


def control_address(cluster: spec_lib.ClusterSpec) -> str:
  """The chief's control address by convention: chief host, TF port + 1."""
  chief = cluster.addresses(spec_lib.JobType.CHIEF)
  if not chief:
    raise spec_lib.ClusterSpecError("cluster.chief: no chief, so no control channel")
  return _next_port(chief[0])


def _next_port(address: str) -> str:
  host, _, port = address.rpartition(":")
  return f"{host}:{int(port) + 1}"


def control_addresses(cluster: spec_lib.ClusterSpec) -> tuple[str, ...]:
  """Every chief replica's control address (a standby chief: two)."""
  return tuple(map(_next_port, cluster.addresses(spec_lib.JobType.CHIEF)))


class ControlServer:
  """Serves `Notice` by calling `handler(notice) -> Reply` on a named thread.

  The handler may block (it waits for a checkpoint save); each call runs on
  its own thread of a small pool, and the caller's deadline bounds it.
  """

  def __init__(self, address: str, handler: Callable[[Notice], Reply]):
    self._handler = handler
    self._server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tfps-control"))
    handlers = {"Notice": grpc.unary_unary_rpc_method_handler(
        self._notice, request_deserializer=_decode, response_serializer=_encode)}
    self._server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    port = address.rpartition(":")[2]
    if self._server.add_insecure_port(f"[::]:{port}") == 0:
      raise OSError(f"control channel: cannot listen on port {port}")
    self.address = address

  def start(self) -> "ControlServer":
    self._server.start()
    return self

  def stop(self) -> None:
    self._server.stop(grace=1.0).wait(5.0)

  def _notice(self, request: dict, context: grpc.ServicerContext) -> dict:
    try:
      notice = Notice(**request)
    except (TypeError, ValueError) as e:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad notice {request!r}: {e}")
    return dataclasses.asdict(self._handler(notice))


def send_notice(address: str, notice: Notice) -> Reply:
  """Tells the chief at `address`; waits at most `notice.deadline_seconds`.

  Raises:
    grpc.RpcError: the chief is unreachable, or did not answer in time
      (`code()` is UNAVAILABLE or DEADLINE_EXCEEDED).
  """
  with grpc.insecure_channel(address) as channel:
    call = channel.unary_unary(_METHOD, request_serializer=_encode,
                               response_deserializer=_decode)
    reply = call(dataclasses.asdict(notice), timeout=notice.deadline_seconds,
                 wait_for_ready=False)
  return Reply(**reply)


def send_to_chiefs(addresses: Sequence[str], notice: Notice) -> tuple[str, Reply]:
  """Tells whichever chief replica coordinates: the first of `addresses` that does
  not refuse (only the coordinating one serves the channel). Returns it and its reply.

  Raises:
    grpc.RpcError: the last address's error when none answered; a chief that
      took the notice but did not answer in time (DEADLINE_EXCEEDED) at once.
  """
  error = None
  for address in addresses:
    try:
      return address, send_notice(address, notice)
    except grpc.RpcError as e:
      if e.code() != grpc.StatusCode.UNAVAILABLE:
        raise
      error = e
  if error is None:
    raise ValueError("send_to_chiefs: no chief address")
  raise error


def _encode(message: dict) -> bytes:
  return json.dumps(message).encode("utf-8")


def _decode(data: bytes) -> dict:
  return json.loads(data.decode("utf-8"))
