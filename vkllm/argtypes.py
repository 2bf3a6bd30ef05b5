"""argparse types for the commands' counts (tokens, repetitions, context positions, sequences),
sizes and seeds, intervals, TCP ports and Redis URLs: a value below 1 (a size or seed below 0, an
interval not above 0, a port outside 0-65535) or a URL of another scheme is refused as that flag's
usage error, where it would otherwise end in a division by zero, an empty range, a busy loop,
another port than asked or a ValueError deep inside a run."""
import argparse
import urllib.parse


def count(text: str) -> int:
    """A whole number of at least 1."""
    return _whole_at_least(text, 1)


def whole(text: str) -> int:
    """A whole number of at least 0 (a size that may be none, a numpy seed)."""
    return _whole_at_least(text, 0)


def _whole_at_least(text: str, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = lowest - 1
    if value < lowest:
        raise argparse.ArgumentTypeError(f"not a whole number of at least {lowest}: {text!r}")
    return value


def counts(text: str) -> list[int]:
    """Comma-separated whole numbers of at least 1 (`1,8,32`)."""
    try:
        return [count(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers of at least 1: {text!r}") from None


def seconds(text: str) -> float:
    """A number of seconds above 0 (an interval that a loop waits between rounds)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds above 0: {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535: the socket layer takes a larger one modulo 65536."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0 to 65535): {text!r}")
    return value


def redis_url(text: str) -> str:
    """A URL redis-py connects to (its schemes; redis-py would fail later with a traceback)."""
    if urllib.parse.urlsplit(text).scheme not in ("redis", "rediss", "unix"):
        raise argparse.ArgumentTypeError(f"not a redis://, rediss:// or unix:// URL: {text!r}")
    return text
