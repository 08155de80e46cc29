"""The ground floor: what every part of tfps uses and that imports nothing of tfps.

`errors` (exception types and exit codes), `signals` (stop signals as a flag),
`messages` (one-line error text), `log_summary` (TensorFlow's gRPC log records
summarized into one line per event).
"""
