"""What the tests share, in one place (the fixtures themselves are in tests/conftest.py).

* `paths`: where the repository, tests/data, scripts/ and the experiments are;
* `tfps_command`: the `tfps` command line run as a user runs it;
* `crash_check`: the suite's check for crashes in whatever its processes wrote;
* `procs`: what /proc says about a process (alive, parent, command line, CPU time);
* `fakes`: stand-ins (a clock; ClusterCoordinator's workers and coordinator);
* `inprocess`: the shape of the in-process cluster the TensorFlow tests share,
  and `linear_models`: the plain Orbit trainer and evaluator they train on it;
* `chief_run`: a supervised chief on a LocalCluster, as the fault tests watch it;
* `experiments/`: experiments that chiefs import by name (`input_experiments:counting`)
  with that directory on PYTHONPATH (conftest's `experiments_importable`).
"""
