"""`python -m tfps ...` is the `tfps` command."""

from tfps.commands import cli

if __name__ == "__main__":
  cli.run_main()
