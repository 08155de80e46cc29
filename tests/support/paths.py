"""Where the suite's files are, wherever a test file sits in tests/."""

import os

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS_DIR)
DATA_DIR = os.path.join(TESTS_DIR, "data")
SCRIPTS_DIR = os.path.join(REPO, "scripts")
# input_experiments, fault_experiments, user_experiments: chiefs import them by
# name (`--experiment=input_experiments:counting`) with this directory on PYTHONPATH.
EXPERIMENTS_DIR = os.path.join(TESTS_DIR, "support", "experiments")
