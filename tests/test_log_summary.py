"""The gRPC log summarizer is a pure line filter: test it line by line."""

from recovery import log_summary

REFUSED = ("2026-11-21 23:55:00.123456: E tensorflow/core/distributed_runtime/eager/"
           "remote_copy_node.cc:123] UNAVAILABLE: failed to connect to all addresses; last error: "
           "UNKNOWN: ipv4:127.0.0.1:{port}: Failed to connect to remote host: Connection refused")
GLOG_UNAVAILABLE = ("E0000 00:00:1795305226.996703    3108 grpc_remote_worker.cc:99] "
                    "Unavailable: Socket closed from /job:worker/replica:0/task:1 "
                    "additional GRPC error information: {...}")


def feed_all(summarizer, lines, start=0.0, step=0.1):
  out = []
  for i, line in enumerate(lines):
    out += summarizer.feed(line, start + i * step)
  return out


def test_repeated_grpc_errors_become_one_line():
  summarizer = log_summary.LogSummarizer(quiet_seconds=30)
  out = feed_all(summarizer, [REFUSED.format(port=1234)] * 50)
  assert out == ["grpc: UNAVAILABLE from ipv4:127.0.0.1:1234: connection refused"]


def test_after_quiet_period_the_count_is_reported():
  summarizer = log_summary.LogSummarizer(quiet_seconds=30)
  feed_all(summarizer, [REFUSED.format(port=1234)] * 10, start=0, step=1)
  out = summarizer.feed(REFUSED.format(port=1234), 40.0)
  assert out == ["grpc: UNAVAILABLE from ipv4:127.0.0.1:1234: connection refused "
                 "(9 similar in the last 40s)"]


def test_different_peers_are_different_events():
  summarizer = log_summary.LogSummarizer()
  out = feed_all(summarizer, [REFUSED.format(port=1), REFUSED.format(port=2),
                              GLOG_UNAVAILABLE, GLOG_UNAVAILABLE])
  assert out == ["grpc: UNAVAILABLE from ipv4:127.0.0.1:1: connection refused",
                 "grpc: UNAVAILABLE from ipv4:127.0.0.1:2: connection refused",
                 "grpc: UNAVAILABLE from /job:worker/replica:0/task:1: connection reset"]


def test_startup_noise_is_dropped_and_other_lines_pass():
  summarizer = log_summary.LogSummarizer()
  noise = [
      "2026-11-21 23:51:28.221546: I tensorflow/core/util/port.cc:153] oneDNN custom operations "
      "are on. You may see slightly different numerical results.",
      "2026-11-21 23:51:28.222748: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:31] Could "
      "not find cuda drivers on your machine, GPU will not be used.",
      "I0000 00:00:1795305226.996703    3108 grpc_server_lib.cc:466] Started server with target: "
      "grpc://localhost:39317",
  ]
  ours = ["I1121 23:53:46.997066 139779387763584 server.py:97] serving ps:0 at localhost:1",
          "Traceback (most recent call last):",
          "2026-11-21 23:51:28.2: W tensorflow/core/framework/op_kernel.cc:1] Out of range: End"]
  assert feed_all(summarizer, noise + ours) == ours
