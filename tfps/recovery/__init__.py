"""What happens when something fails: failure kinds, exit codes, log summaries."""
