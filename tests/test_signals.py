"""SIGTERM and SIGHUP end a mascot command as Ctrl-C does, so what it started is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_waiting_command_stops_on_the_signal_as_on_ctrl_c(sig: signal.Signals) -> None:
    # an interactive chat waits for the person's first message (no model is asked before it)
    process = subprocess.Popen(
        [sys.executable, "-m", "mascot", "chat", "--roster", "emotional_support", "--base-url",
         "http://127.0.0.1:9/v1", "--model", "x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 60
    prompt = ""
    while "you>" not in prompt and time.monotonic() < deadline:
        prompt += os.read(process.stdout.fileno(), 64).decode()
    assert "you>" in prompt
    process.send_signal(sig)
    process.wait(timeout=30)  # before stdin closes: an end of input would end the chat too
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err
