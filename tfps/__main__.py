"""`python -m tfps ...` is the `tfps` command."""

from tfps import cli

if __name__ == "__main__":
  cli.run_main()
