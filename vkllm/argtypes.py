"""argparse types for the commands' counts (tokens, repetitions, context positions, sequences):
a value below 1 is refused as that flag's usage error, where it would otherwise end in a
division by zero or an empty range deep inside a run."""
import argparse


def count(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return value


def counts(text: str) -> list[int]:
    """Comma-separated whole numbers of at least 1 (`1,8,32`)."""
    try:
        return [count(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers of at least 1: {text!r}") from None
