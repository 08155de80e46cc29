"""The in-process cluster the TensorFlow tests share (conftest's `inprocess_cluster`:
its ps and workers are servers in the test process, which is the chief).

TensorFlow connects a process to one cluster at a time and its servers cannot
be stopped: the session starts this one once, and each module connects its own
strategy to it (`runtime`), as a restarted coordinator would. No TensorFlow here.
"""

NUM_PS, NUM_WORKERS = 2, 2
# The ctr those tests train: one epoch of 512 batches of 256, more than any test trains.
SMALL_CTR = {"vocab_sizes": "3000:2000:1000", "embedding_dim": "8", "hidden": "32:16",
             "eval_examples": "4096", "train_examples": "131072"}
