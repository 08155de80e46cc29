"""The server side of a ps or worker task: tf.distribute.Server, signals, exit codes."""
