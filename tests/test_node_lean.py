"""The node agent starts without nats-py's optional websocket transport (aiohttp: about 10 MB of its RSS) and
therefore refuses websocket URLs with a settings error instead of failing at every connect."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcbus.cli import command_words

PROBE = (
    "import sys; from hpcbus import cli; rc = cli.main(sys.argv[1:]); "
    "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'), file=sys.stderr); "
    "sys.exit(rc)"
)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_command_words_skip_leading_options() -> None:
    assert command_words(["-v", "produce", "node", "--nats", "nats://x"]) == ("produce", "node")
    assert command_words(["--version"]) == ()
    assert command_words(["consume", "influx"]) == ("consume", "influx")


def test_node_agent_runs_without_aiohttp() -> None:
    done = _run("produce", "node", "--once", "--cluster", "lean", "--settle", "0.2")
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stderr
    assert ",hostname=" in done.stdout  # a real sample was taken and formatted


def test_aiohttp_is_hidden_only_while_nats_is_imported() -> None:
    # the same process can still import it afterwards (nats-py's websocket transport stays off)
    code = (
        "import sys; from hpcbus import cli; "
        "cli.main(['produce', 'node', '--once', '--cluster', 'lean', '--settle', '0.1']); "
        "import nats.aio.transport as t; import aiohttp; "
        "print(t.aiohttp is None, aiohttp.ClientSession is not None, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stderr.strip().endswith("True True"), done.stderr


@pytest.mark.parametrize("url", ["ws://127.0.0.1:1", "WSS://127.0.0.1:1"])  # nats-py reads both schemes
def test_websocket_url_is_a_settings_error(url: str) -> None:
    done = _run("produce", "node", "--nats", url, "--cluster", "lean")
    assert done.returncode == 2
    assert url in done.stderr and "nats:// or tls://" in done.stderr
    assert "Traceback" not in done.stderr
