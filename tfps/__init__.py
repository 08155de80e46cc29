"""The command-line edge: flags and subcommands of the `tfps` binary."""
