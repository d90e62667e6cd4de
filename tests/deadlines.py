"""A block that must end in time: the tests of hangs fail instead of hanging the suite."""

import contextlib
import signal


@contextlib.contextmanager
def deadline(seconds=20, what="still running"):
    """Raise TimeoutError("<what> after <seconds> s") in the main thread when the block has not ended in time."""
    def expired(number, frame):
        raise TimeoutError(f"{what} after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
