"""`tfps`: the one binary. `tfps run` serves any role; `tfps local` runs a cluster.

This is the binary edge: the only place that defines flags, reads the
environment (TF_CONFIG) and turns exception types into exit codes.

  tfps run      role from TF_CONFIG, --cluster_spec FILE, host flags, or a JobSet pod's
                own name (--cluster_from=jobset);
                ps/worker serve until SIGTERM; chief runs the coordinator.
  tfps local    a whole cluster as local processes on a private loopback.
  tfps chaos    tfps local under a seeded schedule of real faults.
  tfps k8s      Kubernetes manifests (a JobSet, or a Kubeflow TFJob) running tfps run.
  tfps bench    throughput of tfps beside the stock PS patterns, side by side.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

from tfps.base import errors
from tfps.base import settings

FLAGS = flags.FLAGS
COMMANDS = ("run", "local", "chaos", "k8s", "bench")
# One line per command, for `tfps --help`.
_SUMMARIES = {
    "run": "the one binary for every task: ps/worker serve, the chief supervises training",
    "local": "a whole cluster on this machine, run to completion; one JSON line",
    "chaos": "tfps local under real faults; checks every recovery and the input coverage",
    "k8s": "Kubernetes manifests (JobSet or TFJob, + NetworkPolicy) running tfps run",
    "bench": "tfps beside the stock parameter-server patterns, side by side",
}
_sections: dict[str, list[str]] = {}
_defined = set(FLAGS)


def _section(name: str) -> None:
  """Files the flags defined since the previous call under `name` (for per-command help)."""
  global _defined
  _sections[name] = sorted(set(FLAGS) - _defined)
  _defined = set(FLAGS)


def _define(setting: settings.Setting) -> None:
  """The flag of a run setting (`base.settings`: its one default and help)."""
  if setting.kind == "enum":
    flags.DEFINE_enum(setting.name, setting.default, list(setting.choices), setting.help)
  elif setting.kind == "list":
    flags.DEFINE_list(setting.name, list(setting.default), setting.help)
  else:
    define = {"string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
              "float": flags.DEFINE_float, "bool": flags.DEFINE_bool}[setting.kind]
    define(setting.name, setting.default, setting.help)


# --- who am I and where is everyone (tfps run) --------------------------------
flags.DEFINE_string("cluster_spec", None,
                    "JSON file: TF_CONFIG-shaped, or just the {job: [host:port]} map.")
flags.DEFINE_string("job_name", None, "This task's job: chief, ps, worker or evaluator.")
flags.DEFINE_integer("task_index", 0, "This task's index within its job.")
flags.DEFINE_list("ps_hosts", [], "host:port of every ps task (instead of TF_CONFIG).")
flags.DEFINE_list("worker_hosts", [], "host:port of every worker task.")
flags.DEFINE_string("chief_host", None, "host:port of the chief.")
flags.DEFINE_enum("cluster_from", "flags", ["flags", "jobset"],
                  "flags: the cluster from --cluster_spec, host flags or TF_CONFIG; jobset: "
                  "derived from this JobSet pod's name and env with --num_ps, --num_workers "
                  "(--max_workers) and --task_port (what `tfps k8s` renders; "
                  "docs/deployment.md).")
flags.DEFINE_integer("task_port", 2222, "With --cluster_from=jobset: every task's TF port.")
flags.DEFINE_integer("inter_op_threads", None, "TF inter-op threads of a ps/worker server.")
flags.DEFINE_integer("intra_op_threads", None,
                     "TF intra-op threads of a ps/worker server (default: 1 on a ps; on a "
                     "worker, the cores it may use, a container's CPU limit included).")
flags.DEFINE_bool("thread_spinning", False,
                  "ps/worker: let idle TF threads spin (off: they sleep, leaving the "
                  "cores to tasks with work).")
flags.DEFINE_string("graph_cache_dir", None,
                    "worker: where it keeps the function graphs TensorFlow optimized for it, "
                    "for the next coordinator (default: <temp dir>/tfps-graph-cache; for "
                    "tfps local, a scratch directory of the cluster's; '' turns it off).")
flags.DEFINE_bool("tf_runtime_only", True,
                  "ps/worker: load TensorFlow's runtime without its Python API (~1 s instead of "
                  "~8 s of CPU a start); --notf_runtime_only imports all of TensorFlow, for ops "
                  "a library registers from Python.")
flags.DEFINE_bool("preemption_notice", True,
                  "ps/worker: on SIGTERM, warn the chief and wait (within the grace) for its save.")
flags.DEFINE_bool("supervise", True,
                  "chief: run the coordinator as a child process and restart it after a "
                  "ps or cluster loss (--nosupervise: run it in this process).")
flags.DEFINE_string("run_spec", None,
                    "chief, internal: the run's settings from this JSON file instead of flags "
                    "(how tfps local and the supervisor hand a run on).")
flags.DEFINE_string("result_file", None,
                    "chief, internal: write the run's result record to this JSON file.")

for _setting in settings.RUN_SETTINGS:
  if _setting.section == "supervision":
    _define(_setting)

_section("cluster")

# --- what to train (chief) -----------------------------------------------------
for _setting in settings.RUN_SETTINGS:
  if _setting.section == "training":
    _define(_setting)

_section("training")

# --- local cluster ---------------------------------------------------------------
flags.DEFINE_integer("num_ps", 2, "tfps local/k8s, run --cluster_from=jobset: parameter servers.")
flags.DEFINE_integer("num_workers", 2, "tfps local/k8s, run --cluster_from=jobset: workers.")
flags.DEFINE_integer("max_workers", None,
                     "tfps local/chaos/k8s, run --cluster_from=jobset: workers the cluster has "
                     "room for (default: --num_workers). --num_workers start; the others may "
                     "join while it trains (tfps chaos: worker:N@stepS:join; tfps k8s: scale "
                     "the JobSet's worker Job, docs/deployment.md), and the chief trains once "
                     "--min_workers answer (here by default --num_workers).")
flags.DEFINE_bool("isolate_network", True,
                  "tfps local: run the cluster in a private network namespace (needs root).")
flags.DEFINE_enum("hosts", "loopback", ["loopback", "netns"],
                  "tfps local/chaos: loopback (every task on one private loopback) or netns "
                  "(every task on its own virtual host and address, as on separate VMs; "
                  "needed for 'cut' faults; needs root).")
flags.DEFINE_bool("new_address_on_restart", True,
                  "tfps local/chaos --hosts=netns: a task started again comes back on a new "
                  "virtual host at a new address under the same name, as a Kubernetes pod "
                  "does (false: at the same address).")

flags.DEFINE_bool("chief_standby", False,
                  "tfps local/chaos/k8s, run --cluster_from=jobset: a second chief replica on "
                  "a host of its own stands by, imported, and takes over when the first is "
                  "lost (the cluster spec lists two chiefs; see --chief_lease_seconds).")

_section("local")

# --- chaos -------------------------------------------------------------------------
flags.DEFINE_string("faults", None,
                    "tfps chaos: explicit faults TARGET@SECONDS:ACTION[+SECONDS|+never], "
                    "comma-separated, e.g. worker:1@20:kill+5,ps:0@40:term+3; actions kill, "
                    "term, stop, cut, and join/leave for workers (with --max_workers).")
flags.DEFINE_integer("fault_count", 3, "tfps chaos: random faults (>= 3: worker, ps, chief).")
flags.DEFINE_float("chaos_duration", 60.0, "tfps chaos: seconds of training to spread faults over.")
flags.DEFINE_float("restart_delay", 5.0, "tfps chaos: seconds before a faulted task comes back.")
flags.DEFINE_bool("worker_never_returns", False, "tfps chaos: one worker fault is permanent.")

_section("chaos")

# --- bench -------------------------------------------------------------------------
flags.DEFINE_bool("quick", False, "tfps bench: short windows (whole run under 5 minutes).")
flags.DEFINE_bool("scaling", False,
                  "tfps bench: tfps alone on 1/2/4 workers x 1/2 ps (first --bench_sizes).")
flags.DEFINE_bool("recovery", False,
                  "tfps bench: seconds from worker/ps/chief kill to progress (tfps chaos) "
                  "and checkpoint cost (save, asynchronous save's stall, restore) at "
                  "1M/10M/100M/500M parameters (needs ~10 GB of memory).")
flags.DEFINE_integer("repeats", 3, "tfps bench: timed windows per variant (median reported).")
flags.DEFINE_integer("window_steps", 500, "tfps bench: steps in one timed window.")
flags.DEFINE_integer("warmup_steps", 200, "tfps bench: untimed steps before the first window.")
flags.DEFINE_list("bench_sizes", ["default", "dense"],
                  "tfps bench: ctr model sizes (default, dense, tiny).")
flags.DEFINE_list("bench_variants", ["single_process", "tutorial", "model_garden", "tfps"],
                  "tfps bench: patterns to compare.")

_section("bench")

# --- kubernetes ----------------------------------------------------------------------
flags.DEFINE_enum("format", "jobset", ["jobset", "tfjob"],
                  "tfps k8s: jobset (JobSet jobset.x-k8s.io/v1alpha2, plain Indexed Jobs) or "
                  "tfjob (Kubeflow training-operator v1, legacy).")
flags.DEFINE_string("job", "tfps", "tfps k8s: the JobSet's (or TFJob's) name, a DNS label.")
flags.DEFINE_string("image", None, "tfps k8s: container image with tfps installed.")
flags.DEFINE_string("volume_claim", "tfps-model",
                    "tfps k8s: ReadWriteMany claim mounted at /model ('' for a bucket model_dir).")


_section("k8s")
# The flags each command reads; `tfps CMD --help` lists these only.
_HOST_ONLY = {"cluster_spec", "job_name", "task_index", "ps_hosts", "worker_hosts",
              "chief_host", "cluster_from", "task_port", "inter_op_threads", "intra_op_threads",
              "thread_spinning", "graph_cache_dir", "tf_runtime_only", "preemption_notice",
              "supervise",
              "exclude_tasks", "lease_generation", "run_spec", "result_file"}
_CHIEF = [f for f in _sections["cluster"] if f not in _HOST_ONLY] + _sections["training"]
COMMAND_FLAGS = {
    "run": _sections["cluster"] + ["num_ps", "num_workers", "max_workers", "chief_standby"]
           + _sections["training"],
    "local": _CHIEF + ["graph_cache_dir"] + _sections["local"],
    "chaos": _CHIEF + ["graph_cache_dir"] + _sections["local"] + _sections["chaos"],
    "k8s": _CHIEF + ["num_ps", "num_workers", "max_workers", "chief_standby"]
           + _sections["k8s"],
    "bench": ["model_dir", "num_ps", "num_workers", "global_batch_size", "steps_per_loop",
              "steps_per_closure", "checkpoint_interval", "min_shard_bytes", "train_steps",
              "seed", "isolate_network", "ready_timeout", "faults"] + _sections["bench"],
}


def help_text(command: str | None) -> str:
  """`tfps --help` (the commands) or `tfps CMD --help` (that command's flags, defaults)."""
  if command is None:
    width = max(map(len, COMMANDS))
    lines = ["usage: tfps COMMAND [--flags]   (tfps COMMAND --help: its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {_SUMMARIES[name]}" for name in COMMANDS]
    return "\n".join(lines) + "\n"
  lines = [f"usage: tfps {command} [--flags]   ({_SUMMARIES[command]})", "", "flags:"]
  for name in COMMAND_FLAGS[command]:
    flag = FLAGS[name]
    default = flag.default_as_str.strip("'") if flag.default is not None else "none"
    lines.append(f"  --{name} (default: {default})")
    lines.append(f"      {flag.help}")
  return "\n".join(lines) + "\n"


def _fail(message: str, code: errors.ExitCode) -> None:
  """One line on stderr, then exit with `code`."""
  sys.stderr.write(f"tfps: error: {message}\n")
  sys.stderr.flush()
  sys.exit(int(code))


def _parse_flags(argv: list[str]) -> list[str]:
  if any(a in ("--help", "-h", "--helpshort", "--helpfull", "-?") for a in argv[1:]):
    command = next((a for a in argv[1:] if a in COMMANDS), None)
    sys.stdout.write(help_text(command))
    sys.exit(0)
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).splitlines()[0], errors.ExitCode.USAGE)
  if len(rest) != 2 or rest[1] not in COMMANDS:
    got = " ".join(rest[1:]) or "nothing"
    _fail(f"command: expected one of {', '.join(COMMANDS)}, got {got!r} "
          "(usage: tfps run|local|chaos|k8s|bench [--flags])", errors.ExitCode.USAGE)
  return rest


def _prepare_environment() -> None:
  """Settings TensorFlow reads from the environment, before it is imported."""
  # TF's parameter-server tutorial: fail RPCs fast so the coordinator learns
  # of lost tasks in seconds, not after gRPC's long reconnect backoff.
  os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
  # C++ INFO lines are start-up chatter; warnings and errors stay (summarised).
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  # tf.keras is tf_keras (Keras 2), the Keras that works under
  # ParameterServerStrategy. Otherwise importing TensorFlow imports Keras 3
  # as well (to find tf.keras), about a quarter of the import: seconds of
  # every ps, worker and coordinator start (docs/tensorflow-behaviour.md).
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
  os.environ["TF_GRPC_DEFAULT_OPTIONS"] = grpc_options(os.environ.get("TF_GRPC_DEFAULT_OPTIONS"))


# gRPC looks a name up again at most every 30 s by default. A task restarted
# under the same name at a new address (a Kubernetes pod) was found ~9 s later
# than one at the same address, measured on virtual hosts; a channel whose one
# look-up after the failure came before the replacement had an address could
# wait the whole 30 s (docs/tensorflow-behaviour.md).
_DNS_REFRESH = "grpc.dns_min_time_between_resolutions_ms=1000"


def grpc_options(user: str | None) -> str:
  """TF_GRPC_DEFAULT_OPTIONS (TF's channel arguments) with a 1 s DNS refresh, unless set."""
  options = [o for o in (user or "").split(",") if o]
  if not any(o.startswith("grpc.dns_min_time_between_resolutions_ms=") for o in options):
    options.append(_DNS_REFRESH)
  return ",".join(options)


def main(argv: list[str]) -> None:
  command = argv[1]
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  _prepare_environment()
  if command == "run":
    from tfps.commands import run as run_command
    code = run_command.run(FLAGS)
  elif command == "local":
    from tfps.commands import local as local_command
    code = local_command.run(FLAGS)
  elif command == "chaos":
    from tfps.commands import chaos as chaos_command
    code = chaos_command.run(FLAGS)
  elif command == "bench":
    from tfps.commands import bench as bench_command
    code = bench_command.run(FLAGS)
  else:
    from tfps.commands import k8s as k8s_command
    code = k8s_command.run(FLAGS)
  sys.exit(int(code))


def run_main() -> None:
  """Console-script entry point."""
  try:
    app.run(main, flags_parser=_parse_flags)
  except errors.TfpsError as e:
    _fail(str(e), e.exit_code)
