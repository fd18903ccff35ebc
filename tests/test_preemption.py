"""The stop request's signal handler: it records the signal and nothing more, so it can never write into a stream
in the middle of another write of it (which Python refuses as a "reentrant call"); the training loop says the
stop is on its way (tests/test_resume.py runs it)."""

import signal

import pytest

from bert_squad.preemption import StopRequest


@pytest.mark.parametrize("sig", StopRequest.SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_handler_records_the_signal_and_writes_nothing(sig, capfd):
    before = signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        signal.raise_signal(sig)  # the handler runs before raise_signal returns
        said = capfd.readouterr()
        assert (said.out, said.err) == ("", "")
        assert stop.requested and stop.signum == sig
        assert stop.first_seen() == sig and stop.first_seen() is None  # the loop is told once
        # After a first Ctrl-C a second one takes SIGINT's default action, at once.
        assert signal.getsignal(signal.SIGINT) == (signal.SIG_DFL if sig == signal.SIGINT else stop._handle)
    assert signal.getsignal(signal.SIGINT) == before
