"""The gRPC log summarizer is a pure line filter: test it line by line.

`data/worker_and_ps_loss_stderr.txt` is a real capture: the stderr of a
coordinator (TF 2.20) that lost a worker, recovered, then lost its ps. The
`MARK` lines are the capturing script's own and must survive.
"""

import os
import threading

from tfps.base import log_summary

from tests.support import paths

CAPTURE = os.path.join(paths.DATA_DIR, "worker_and_ps_loss_stderr.txt")
REFUSED = ("2026-11-21 23:55:00.123456: E tensorflow/core/distributed_runtime/eager/"
           "remote_copy_node.cc:123] UNAVAILABLE: failed to connect to all addresses; last error: "
           "UNKNOWN: ipv4:127.0.0.1:{port}: Failed to connect to remote host: Connection refused")


def feed_all(summarizer, lines, start=0.0, step=0.01):
  out = []
  for i, line in enumerate(lines):
    out += summarizer.feed(line.rstrip("\n"), start + i * step)
  return out + summarizer.flush(start + len(lines) * step)


def test_real_capture_becomes_one_line_per_event():
  with open(CAPTURE) as f:
    lines = f.readlines()
  assert len(lines) > 40
  out = feed_all(log_summary.LogSummarizer(), lines)
  assert [l for l in out if not l.startswith("MARK")] == [
      "grpc: UNAVAILABLE from worker:1 (127.0.0.1:45631): connection refused",
      "grpc: UNAVAILABLE from ps:0 (127.0.0.1:42521): connection refused",
  ]
  assert [l.split()[1] for l in out if l.startswith("MARK")] == ["before", "joined", "ps"]


def test_repeats_are_counted_and_reported_after_the_quiet_period():
  summarizer = log_summary.LogSummarizer(quiet_seconds=30)
  # Ten records, one a second; each is timed when it ends (the next starts).
  out = feed_all(summarizer, [REFUSED.format(port=1234)] * 10, start=0, step=1)
  assert out == ["grpc: UNAVAILABLE from 127.0.0.1:1234: connection refused"]
  out = summarizer.feed(REFUSED.format(port=1234), 40.0) + summarizer.flush(40.0)
  assert out == ["grpc: UNAVAILABLE from 127.0.0.1:1234: connection refused "
                 "(9 similar in the last 39s)"]


def test_different_peers_are_different_events():
  out = feed_all(log_summary.LogSummarizer(),
                 [REFUSED.format(port=1), REFUSED.format(port=2), REFUSED.format(port=1)])
  assert out == ["grpc: UNAVAILABLE from 127.0.0.1:1: connection refused",
                 "grpc: UNAVAILABLE from 127.0.0.1:2: connection refused"]


def test_a_record_ends_at_a_line_that_is_not_its_continuation():
  summarizer = log_summary.LogSummarizer()
  out = summarizer.feed(REFUSED.format(port=7), 0.0)
  assert out == []  # Held until the record ends.
  out = summarizer.feed("Additional GRPC error information from remote target "
                        "/job:ps/replica:0/task:3 while calling X:", 0.1)
  assert out == []
  # Held: TF's messages go on in plain text ("Socket closed") before more details.
  assert summarizer.feed("plain output of the user's program", 0.2) == []
  out = summarizer.feed("I1122 01:00:01.000000 140444550441856 progress.py:80] step 400", 0.3)
  assert out == ["grpc: UNAVAILABLE from ps:3 (127.0.0.1:7): connection refused",
                 "plain output of the user's program",
                 "I1122 01:00:01.000000 140444550441856 progress.py:80] step 400"]
  # Or when input pauses.
  summarizer.feed(REFUSED.format(port=8), 40.0)
  assert summarizer.feed("more of the user's output", 40.1) == []
  assert summarizer.flush(40.6) == [
      "grpc: UNAVAILABLE from 127.0.0.1:8: connection refused", "more of the user's output"]


def test_a_records_plain_text_line_followed_by_grpc_details_stays_in_the_record():
  # A ps SIGKILLed under a running closure (2026-11-26, tfps chaos, TF 2.20):
  # the worker's failure, whose message goes on in plain text, then the
  # details naming the ps; then the cancellation of the closures behind it.
  lines = [
      "W1126 13:08:47.470000 140105431985024 cluster_coordinator.py:966] Worker "
      "/job:worker/replica:0/task:0 failed with UnavailableError():",
      "Socket closed",
      "Additional GRPC error information from remote target /job:ps/replica:0/task:1/device:CPU:0"
      " while calling /tensorflow.eager.EagerService/RunComponentFunction:",
      ':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}',
      "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
      "calling /tensorflow.eager.EagerService/Enqueue:",
      ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:" Socket closed"}',
      "It is treated as a transient connectivity failure for now.",
      "I1126 13:08:47.484322 140105431985024 cluster_coordinator.py:407] Canceling all "
      "closures: waiting for inflight closures to finish",
      "W1126 13:08:47.485000 140105431985024 cluster_coordinator.py:300] /job:worker/replica:0/"
      "task:0 CancelledError: cancelled",
      "This derived error is ignored and not reported to users.",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [
      "grpc: UNAVAILABLE from ps:1: connection reset", lines[7],
      "grpc: CANCELLED from worker:0: cancelled"]


def test_startup_noise_is_dropped_and_other_lines_pass():
  noise = [
      "2026-11-21 23:51:28.221546: I tensorflow/core/util/port.cc:153] oneDNN custom operations "
      "are on. You may see slightly different numerical results.",
      "2026-11-21 23:59:01.998104: I tensorflow/core/platform/cpu_feature_guard.cc:210] This "
      "TensorFlow binary is optimized to use available CPU instructions.",
      "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild.",
      "I0000 00:00:1795305226.996703    3108 grpc_server_lib.cc:466] Started server with target: "
      "grpc://localhost:39317",
  ]
  ours = ["I1121 23:53:46.997066 139779387763584 server.py:97] serving ps:0 at localhost:1",
          "Traceback (most recent call last):",
          "2026-11-21 23:51:28.2: W tensorflow/core/framework/op_kernel.cc:1] Out of range: End"]
  assert feed_all(log_summary.LogSummarizer(), noise + ours) == ours


CHILD = """
import sys, time
from tfps.base import log_summary
log_summary.install_stderr_filter()
sys.stderr.write("first line\\n")
sys.stderr.flush()
time.sleep(60)
"""


def test_filter_forwards_a_line_while_the_process_keeps_running():
  import select
  import subprocess
  import sys
  child = subprocess.Popen([sys.executable, "-c", CHILD], stderr=subprocess.PIPE)
  try:
    ready, _, _ = select.select([child.stderr], [], [], 10)
    assert ready, "no line from the filtered stderr within 10 s"
    assert child.stderr.readline() == b"first line\n"
    assert child.poll() is None  # Forwarded live, not at exit.
  finally:
    child.kill()
    child.wait(10)


def test_records_whose_status_comes_on_a_later_line():
  """Real capture: TF failing to register a function on a dead worker."""
  path = os.path.join(paths.DATA_DIR,
                      "worker_down_function_registration_stderr.txt")
  with open(path) as f:
    lines = f.readlines()
  out = feed_all(log_summary.LogSummarizer(), lines)
  grpc = [l for l in out if l.startswith("grpc: ")]
  assert grpc == ["grpc: UNAVAILABLE from worker:1 (127.0.0.1:43359): connection refused"]
  assert not any("Additional GRPC" in l or "could happen" in l for l in out)
  assert any("progress.py" in l for l in out)  # Our own lines pass.


def test_our_own_lines_about_unreachable_tasks_are_not_taken_for_grpc_records():
  ours = ("W1122 01:10:41.0 140444550441856 supervisor.py:207] worker:1 unreachable for 20s: "
          "saving and restarting the coordinator without it")
  assert feed_all(log_summary.LogSummarizer(), [ours]) == [ours]


def test_chained_tf_errors_stay_inside_their_record():
  lines = [
      "ERROR:tensorflow:Start cancelling closures due to error UnavailableError(): ",
      "2 root error(s) found.",
      "  (0) UNAVAILABLE:  failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:127.0.0.1:44557: Failed to connect to remote host: Connection refused",
      "Additional GRPC error information from remote target /job:ps/replica:0/task:0/device:CPU:0 "
      "while calling /tensorflow.eager.EagerService/RunComponentFunction:",
      ":UNKNOWN:Error received from peer  {grpc_status:14}",
      "0 derived errors ignored.",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [
      "grpc: UNAVAILABLE from ps:0 (127.0.0.1:44557): connection refused"]


def test_our_error_line_is_never_absorbed_into_a_tf_record():
  lines = [
      "2026-11-21 23:51:28.221546: I tensorflow/core/util/port.cc:153] oneDNN custom operations "
      "are on.",
      "tfps: error: train_steps (0) must be a positive integer",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [lines[1]]
  record = [REFUSED.format(port=9), "tfps: error: lost the cluster during training: x"]
  assert feed_all(log_summary.LogSummarizer(), record) == [
      "grpc: UNAVAILABLE from 127.0.0.1:9: connection refused", record[1]]


def test_a_tf_record_whose_status_code_is_only_in_its_grpc_details():
  # Seen after a worker restart: the header names no code; gRPC's detail lines
  # carry grpc_status:10 (ABORTED). The header must not leak raw.
  lines = [
      "W0000 00:00:1795305556.405225    8749 remote_mgr.cc:200] Unable to find a context_id "
      "matching the specified one (4711). Perhaps the worker was restarted, or the context "
      "was GC'd?",
      "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
      "while calling /tensorflow.eager.EagerService/Enqueue:",
      ":UNKNOWN:Error received from peer  {grpc_message:\"Unable to find a context_id\", "
      "grpc_status:10, created_time:\"2026-11-22T01:00:00+00:00\"}",
      "I1122 01:00:01.000000 140444550441856 progress.py:80] step 400",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [
      "grpc: ABORTED from worker:1", lines[-1]]


def test_orbits_per_loop_line_is_dropped_for_ours():
  orbit = ("I1122 03:41:21.000180 139908683422592 controller.py:535] train | step:   5900 | "
           "steps/sec:  120.7 | output: {'examples_per_second': 71479.1, 'loss': 0.458}")
  ours = ("I1122 03:41:21.720708 139908683422592 progress.py:104] step 6000/40000 | "
          "145.4 steps/s | 74,462 examples/s | loss 0.4577 | ETA 0:03:54")
  assert feed_all(log_summary.LogSummarizer(), [orbit, ours]) == [ours]


def test_tfs_warning_about_its_own_savers_retracing_is_dropped():
  saver = ("W1123 11:16:47.534700 140656848636800 polymorphic_function.py:157] 5 out of the "
           "last 5 calls to <function MultiDeviceSaver.save.<locals>.tf_function_save at "
           "0x7fec9c381440> triggered tf.function retracing. Tracing is expensive and the "
           "excessive number of tracings could be due to (1) creating @tf.function repeatedly")
  users = saver.replace("MultiDeviceSaver.save.<locals>.tf_function_save", "my_step")
  assert feed_all(log_summary.LogSummarizer(), [saver, users]) == [users]


def test_a_tf_line_without_grpc_details_is_shown_unchanged_and_in_order():
  lines = [
      "W0000 00:00:1795305556.405225    8749 some_op.cc:12] something TF wants said",
      "I1122 01:00:01.000000 140444550441856 progress.py:80] step 400",
  ]
  summarizer = log_summary.LogSummarizer()
  assert summarizer.feed(lines[0], 0.0) == []  # Held: details may follow.
  assert summarizer.feed(lines[1], 0.1) == lines
  assert summarizer.feed(lines[0], 0.2) == [] and summarizer.flush(0.7) == [lines[0]]


NO_CODE = ("2026-11-23 14:40:00.000000: E tensorflow/core/distributed_runtime/eager/"
           "remote_copy_node.cc:99] Remote copy from /job:worker/replica:0/task:1 failed: "
           "Socket closed")


def test_a_record_with_no_known_status_is_counted_with_the_peers_last_event():
  summarizer = log_summary.LogSummarizer(quiet_seconds=30)
  refused = REFUSED.format(port=5) + " /job:worker/replica:0/task:1"
  first = summarizer.feed(refused, 0.0) + summarizer.flush(0.0)
  assert first == ["grpc: UNAVAILABLE from worker:1 (127.0.0.1:5): connection refused"]
  # Seen after a worker SIGKILL: a TF record naming the worker, no status code.
  assert summarizer.feed(NO_CODE, 1.0) + summarizer.flush(1.0) == []
  again = summarizer.feed(refused, 40.0) + summarizer.flush(40.0)
  assert again == ["grpc: UNAVAILABLE from worker:1 (127.0.0.1:5): connection refused "
                   "(1 similar in the last 40s)"]


def test_a_record_with_no_known_status_and_no_earlier_event_shows_its_message():
  summarizer = log_summary.LogSummarizer(quiet_seconds=30)
  # gRPC's detail lines make it a gRPC record; status 2 is UNKNOWN, not one we name.
  no_reason = [NO_CODE.replace("Socket closed", "the peer went away"),
               ":UNKNOWN:Error received from peer  {grpc_message:\"went away\", grpc_status:2}"]
  assert feed_all(summarizer, no_reason) == [
      "grpc: error from worker:1: Remote copy from /job:worker/replica:0/task:1 failed: the "
      "peer went away"]
  # Past the quiet period nothing is counted with it: the next is shown.
  assert summarizer.feed(NO_CODE, 31.0) + summarizer.flush(31.0) == [
      "grpc: error from worker:1: connection reset"]


def test_a_closure_error_with_node_locations_stays_one_record():
  # A coordinator's record after a worker's link came back (2026-11-23, netns
  # partition test): TF names the node where each chained error was detected.
  lines = [
      "E1123 16:27:40.500000 139958624713600 cluster_coordinator.py:900] UNAVAILABLE: "
      "recvmsg:Connection reset by peer /job:worker/replica:0/task:1",
      "Detected at node while/LoopCond/_23/_40 defined at (most recent call last):",
      "<stack traces unavailable>",
      "2 root error(s) found.",
      "  (0) UNAVAILABLE:   recvmsg:Connection reset by peer",
      "\t [[GroupCrossDeviceControlEdges_0/Identity/_19]]",
      "0 successful operations.",
      "0 derived errors ignored.",
      "It is treated as a transient connectivity failure for now.",
      "I1123 16:27:40.623583 139958624713600 progress.py:104] step 2401/10000000",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [
      "grpc: UNAVAILABLE from worker:1: connection reset", lines[-1]]


def test_a_servers_session_options_dump_at_each_connection_is_dropped():
  # A worker's stderr when a coordinator connects (2026-11-23, tfps chaos).
  connected = ("I0000 00:00:1795453118.089244   13353 eager_service_impl.cc:349] Creating sync "
               "eager service context with rendezvous_id on host vm /job:worker/replica:0/task:0")
  lines = [
      connected,
      "I0000 00:00:1795453118.089316   13353 eager_service_impl.cc:355] SessionOptions: "
      "device_count {",
      '  key: "CPU"', "  value: 1", "}", "gpu_options {", "  experimental {", "  }", "}",
      "allow_soft_placement: true", "experimental {",
      '  collective_group_leader: "/job:worker/replica:0/task:0"', "}", "",
      "I1123 16:58:40.000000 140213506268032 server.py:127] worker:0: next line",
  ]
  assert feed_all(log_summary.LogSummarizer(), lines) == [connected, lines[-1]]


def test_grpcs_closed_channel_race_leaves_no_thread_traceback_and_other_errors_do():
  # Raised by grpc's polling thread when a probe closes its channel mid-poll
  # (seen once in a 30-minute tfps chaos run, 2026-11-26).
  seen = []
  hook = log_summary.without_grpc_closed_channel_tracebacks(seen.append)

  def raising(error):
    def run():
      raise error
    return run

  old = threading.excepthook
  threading.excepthook = hook
  try:
    for error in (ValueError("Cannot monitor channel state: Channel closed!"),
                  ValueError("something else")):
      thread = threading.Thread(target=raising(error))
      thread.start()
      thread.join(timeout=10)
  finally:
    threading.excepthook = old
  assert [str(args.exc_value) for args in seen] == ["something else"]
