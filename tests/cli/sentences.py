"""What the bad-input tests share: the CLI invoked in-process and the check that a refusal is one sentence
(tests/cli/test_bad_input_*.py; their finished run is tests/cli/conftest.py's)."""

from click.testing import CliRunner

from hasfl_ray.cli.main import main


def invoke(*args):
    """``hasfl-ray ARGS`` in this process (each argument as text)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result, *words, status=2):
    """One sentence on one line, under 200 characters, with the exit status and no traceback, holding ``words``;
    returns it."""
    message = result.output.strip()
    assert result.exit_code == status, message
    assert result.exception is None or isinstance(result.exception, SystemExit), message
    assert len(message.splitlines()) == 1 and message.startswith("Error: "), message
    assert len(message) < 200 + len("Error: "), message
    for word in words:
        assert word in message, (word, message)
    return message
