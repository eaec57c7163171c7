"""Callbacks: refused to private, loopback and link-local destinations unless allowed (checked on the address the
name resolves to when sent, the connection pinned to it), no redirects, no credentials, and kept in the queue so a
callback pending at a stop is sent after the restart, each try recorded."""

from __future__ import annotations

import json
import threading

import pytest

from ditto_fast.core.errors import UsageError
from ditto_fast.serve.jobs.accept import check_callback
from ditto_fast.serve.jobs.callbacks import CallbackPolicy, CallbackSender, parse_networks, redact
from ditto_fast.serve.jobs.queue import JobQueue
from support import Receiver

LOOPBACK = CallbackPolicy(parse_networks(["127.0.0.1/32"]))


@pytest.fixture()
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def _finished_job(q: JobQueue, url: str) -> dict:
    job = q.submit({"avatar": "a"}, callback=url)
    q.take()
    return q.finish(job["id"], "done", exit_code=0)


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.1.2.3", "192.168.1.20", "172.16.0.9", "169.254.169.254",
                                     "fd00::1", "fe80::1", "0.0.0.0", "100.64.0.1", "::ffff:127.0.0.1", "224.0.0.1"])
def test_private_loopback_and_link_local_destinations_are_refused_unless_allowed(address):
    refusal = CallbackPolicy().refusal(address)
    assert refusal and "--callback-allow" in refusal
    assert CallbackPolicy(parse_networks([address])).refusal(address) is None
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(UsageError, match="callback"):
        check_callback(f"http://{host}:8080/hook", CallbackPolicy())


def test_public_destinations_and_allowed_networks_pass_and_bad_cidrs_are_refused():
    policy = CallbackPolicy(parse_networks(["10.20.0.0/16", "fd00::/8"]))
    assert policy.refusal("93.184.216.34") is None and policy.refusal("2606:4700::1111") is None
    assert policy.refusal("10.20.3.4") is None and policy.refusal("fd12::1") is None
    assert policy.refusal("10.21.0.1") is not None
    assert check_callback("https://mam.example.com/hook", CallbackPolicy()) == "https://mam.example.com/hook"
    with pytest.raises(UsageError, match="--callback-allow 10.0.0.300"):
        parse_networks(["10.0.0.300"])


def test_credentials_in_a_callback_url_are_refused_and_never_shown():
    for url in ("http://user:s3cret-pw@mam.example.com/hook", "https://token@mam.example.com/hook"):
        with pytest.raises(UsageError) as e:
            check_callback(url, CallbackPolicy())
        assert "s3cret" not in str(e.value) and "token@" not in str(e.value) and "***@mam.example.com" in str(e.value)
        assert "user name or password" in str(e.value) and len(str(e.value).splitlines()) == 1
    assert redact("http://u:p@h:1/x?y") == "http://***@h:1/x?y" and redact("http://h/x") == "http://h/x"
    for bad in ("file:///etc/passwd", "ftp://x/y", "http://", "http://[::1", "http://h:99999/", 5):
        with pytest.raises(UsageError):
            check_callback(bad, CallbackPolicy())


def test_a_callback_pending_at_a_stop_is_sent_after_the_restart_once(tmp_path, receiver):
    path = tmp_path / "jobs.sqlite"
    url = f"http://127.0.0.1:{receiver.port}/done"
    job = _finished_job(JobQueue(path), url)           # ... and the server stops before its callback goes out
    events: list[dict] = []
    again = JobQueue(path)
    assert CallbackSender(again, LOOPBACK, events.append).send_due() == 1
    assert [g["body"]["id"] for g in receiver.got] == [job["id"]] and receiver.got[0]["body"]["status"] == "done"
    [sent] = again.callbacks_of(job["id"])
    assert sent["tries"] == 1 and sent["sent"] is not None and not events
    assert CallbackSender(JobQueue(path), LOOPBACK, events.append).send_due() == 0 and len(receiver.got) == 1


def test_the_sender_thread_delivers_a_job_that_ends_while_it_runs(tmp_path, receiver):
    q = JobQueue(tmp_path / "jobs.sqlite")
    sender = CallbackSender(q, LOOPBACK, print)
    sender.start()
    try:
        job = _finished_job(q, f"http://127.0.0.1:{receiver.port}/x")
        sender.wake()
        for _ in range(100):
            if q.callbacks_of(job["id"])[0]["sent"]:
                break
            threading.Event().wait(0.05)
    finally:
        sender.stop()
    assert q.callbacks_of(job["id"])[0]["sent"] and receiver.got[0]["body"]["id"] == job["id"]


def test_a_name_resolving_to_a_refused_address_is_refused_when_sent(tmp_path, receiver):
    q = JobQueue(tmp_path / "jobs.sqlite")
    url = f"http://localhost:{receiver.port}/x"
    check_callback(url, CallbackPolicy())                   # a name: accepted, checked on its address when sent
    job = _finished_job(q, url)
    events: list[dict] = []
    CallbackSender(q, CallbackPolicy(), events.append).send_due()
    [tried] = q.callbacks_of(job["id"])
    assert not receiver.got and tried["given_up"] is not None and "loopback" in tried["error"]
    assert "is a loopback address" in events[0]["error"] and "given up" in events[0]["error"]


def test_the_connection_goes_to_the_address_that_was_checked(tmp_path, receiver):
    """The name is resolved once, checked, and that address is the one connected to (a DNS answer that changes
    between the check and the connection changes nothing)."""
    answers = iter([["127.0.0.1"], ["203.0.113.9"]])        # a second resolution would give another address
    q = JobQueue(tmp_path / "jobs.sqlite")
    job = _finished_job(q, f"http://hooks.newsroom.example:{receiver.port}/done?x=1")
    CallbackSender(q, LOOPBACK, print, resolver=lambda host, port: next(answers)).send_due()
    assert receiver.got == [{"path": "/done?x=1", "host": f"hooks.newsroom.example:{receiver.port}",
                             "body": receiver.got[0]["body"]}]
    assert q.callbacks_of(job["id"])[0]["sent"]


def test_redirects_are_not_followed_and_failures_are_retried_then_given_up(tmp_path, receiver):
    receiver.answer, receiver.location = 302, f"http://127.0.0.1:{receiver.port}/elsewhere"
    q = JobQueue(tmp_path / "jobs.sqlite")
    job = _finished_job(q, f"http://user@127.0.0.1:{receiver.port}/hook")   # an old queue's row, say
    events: list[dict] = []
    sender = CallbackSender(q, LOOPBACK, events.append)
    for tries in range(1, 5):
        callback = q.callbacks_of(job["id"])[0]
        sender._try(callback)
        assert q.callbacks_of(job["id"])[0]["tries"] == tries
    assert [g["path"] for g in receiver.got] == ["/hook"] * 4          # never /elsewhere
    last = q.callbacks_of(job["id"])[0]
    assert last["sent"] is None and last["given_up"] is not None and "redirects are not followed" in last["error"]
    assert all("user@" not in json.dumps(e) for e in events) and events[-1]["callback"].startswith("http://***@")
    assert [e["attempt"] for e in events] == [1, 2, 3, 4] and "given up" in events[-1]["error"]


@pytest.mark.slow          # real processes on the wall clock
def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_deadline(monkeypatch):
    """One slow receiver must not hold the one sender thread for hours: a try has a deadline as a whole."""
    import socket
    import time

    from ditto_fast.serve.jobs import callbacks

    server = socket.create_server(("127.0.0.1", 0))

    def trickle() -> None:                      # reads the request, then a byte of answer every 0.2 s
        conn, _ = server.accept()
        conn.recv(65536)
        for _ in range(100):
            try:
                conn.sendall(b"H")
            except OSError:
                break
            time.sleep(0.2)
        conn.close()
    threading.Thread(target=trickle, daemon=True).start()
    monkeypatch.setattr(callbacks, "POST_DEADLINE_S", 1.0)
    t0 = time.monotonic()
    why = callbacks.post(f"http://127.0.0.1:{server.getsockname()[1]}/hook", b"{}", LOOPBACK)
    assert time.monotonic() - t0 < 5 and why == "no answer within 1 s", why
    server.close()
