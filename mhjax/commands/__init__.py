"""The implementations of the command line's commands (cli.py only wires argparse)."""
