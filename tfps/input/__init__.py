"""The training input's position: shards, the ledger, positioned per-worker datasets."""
