"""Integer helpers for sizes and launch shapes."""


def cdiv(a: int, b: int) -> int:
    """a / b rounded up (a >= 0, b > 0)."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """The smallest multiple of b that is at least a."""
    return cdiv(a, b) * b
