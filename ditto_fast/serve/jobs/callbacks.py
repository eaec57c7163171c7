"""A job's callback: its final JSON POSTed to the URL the submitter gave. The queue keeps it (its outbox, written
with the job's final state), so a callback pending when the server stops is sent after its next start; a sender
thread tries each one, then again after RETRY_PAUSES_S, recording every try. Destinations are checked on the address
the name resolves to when it is sent (the connection goes to that address): private, loopback, link-local and other
non-public addresses are refused unless the operator allows them (`--callback-allow CIDR`). Redirects are not
followed; a URL with credentials is refused when the job is accepted, and none is ever logged with them."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
from typing import Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

from ditto_fast.core.errors import UsageError, one_line
from ditto_fast.serve.jobs.queue import JobQueue
from ditto_fast.serve.service_thread import ServiceThread

RETRY_PAUSES_S = (1.0, 4.0, 15.0)       # after the first try: three more, then the job's callback is given up
POST_DEADLINE_S = 30.0           # one try in all, however slowly the receiver answers
TIMEOUT_S = 10.0
IDLE_WAKE_S = 5.0                       # the sender looks at the outbox at least this often

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


def redact(url: str) -> str:
    """`url` with any user name and password replaced by ***, for logs and messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def parse_networks(values: Iterable[str]) -> list[Network]:
    """`--callback-allow` values (CIDRs, or single addresses) as networks; UsageError for one that is neither."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise UsageError(f"--callback-allow {value}: not an address or CIDR (e.g. 10.0.0.0/8, 127.0.0.1, "
                             "fd00::/8)") from None
    return networks


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo, TCP)."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


class CallbackPolicy:
    """Which callback destinations a server may POST to: public addresses, and those in `allow`."""

    def __init__(self, allow: Iterable[Network] = ()):
        self.allow = list(allow)

    def refusal(self, address: str) -> str | None:
        """Why a callback may not go to `address` (an IP), or None if it may."""
        given: Address = ipaddress.ip_address(address.split("%")[0])     # an IPv6 zone index aside
        ip = getattr(given, "ipv4_mapped", None) or given                  # ::ffff:a.b.c.d is a.b.c.d
        if any(a.version == net.version and a in net for a in {given, ip} for net in self.allow):
            return None
        if ip.is_global and not ip.is_multicast:
            return None
        kind = "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else \
            "multicast" if ip.is_multicast else "private" if ip.is_private else "not public"
        return f"{ip} is a {kind} address; callbacks go to public addresses unless the server allows this one " \
               f"(serve --callback-allow {ip}/{ip.max_prefixlen} or a CIDR holding it)"

    def check_url(self, url: str) -> None:
        """UsageError for a callback URL the server would not send to, seen before the job is queued: credentials
        in it, or a literal address this policy refuses (names are checked when sent, on what they resolve to)."""
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            raise UsageError(f"callback {redact(url)}: a URL with a user name or password is refused (it would be "
                             "stored and logged); give the receiver's URL without them")
        try:
            literal = ipaddress.ip_address((parts.hostname or "").split("%")[0])
        except ValueError:
            return
        why = self.refusal(str(literal))
        if why:
            raise UsageError(f"callback {url}: {why}")


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to `address`, whatever `host` (the Host header) resolves to now."""

    def __init__(self, host: str, port: int, address: str):
        super().__init__(host, port, timeout=TIMEOUT_S)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An HTTPS connection to `address`, the certificate checked against `host`."""

    def __init__(self, host: str, port: int, address: str):
        super().__init__(host, port, timeout=TIMEOUT_S, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, policy: CallbackPolicy, resolver: Resolver = resolve) -> str | None:
    """POST `body` to `url` once: None when delivered (a 2xx answer), else why not. Raises _Refused for a
    destination the policy refuses (trying again would not help)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError) as e:
        return f"cannot resolve {host} ({e})"
    refused = [why for a in addresses if (why := policy.refusal(a))]
    if refused or not addresses:
        raise _Refused(refused[0] if refused else f"{host} resolves to no address")
    connection = (_PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP)(host, port, addresses[0])
    cut: list[bool] = []

    def at_deadline() -> None:          # a receiver that trickles its answer: said first, then cut off
        cut.append(True)
        _cut(connection)
    deadline = threading.Timer(POST_DEADLINE_S, at_deadline)
    deadline.start()
    try:
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        reply.read(64 << 10)
        if 200 <= reply.status < 300:
            return None
        if 300 <= reply.status < 400:
            return f"HTTP {reply.status} (redirects are not followed: give the final URL)"
        return f"HTTP {reply.status}"
    except (OSError, http.client.HTTPException) as e:
        return f"no answer within {POST_DEADLINE_S:g} s" if cut else str(e) or type(e).__name__
    finally:
        deadline.cancel()
        connection.close()


def _cut(connection: http.client.HTTPConnection) -> None:
    """End a POST that has run past its deadline (shutting the socket wakes the thread blocked on it)."""
    if connection.sock is not None:
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Refused(Exception):
    pass


class CallbackSender(ServiceThread):
    """A thread sending the queue's pending callbacks (those of earlier runs too), each try recorded in the queue;
    `wake()` when a job ends. Stopped, it leaves what is not sent in the queue for the next start."""

    def __init__(self, queue: JobQueue, policy: CallbackPolicy, log: Callable[[dict], None],
                 resolver: Resolver = resolve):
        super().__init__("ditto-fast-callbacks", log)
        self.queue, self.policy, self.resolver = queue, policy, resolver

    def step(self) -> float:
        self.send_due()
        due = self.queue.next_callback_due()
        return IDLE_WAKE_S if due is None else min(IDLE_WAKE_S, max(0.0, due - time.time()))

    def send_due(self) -> int:
        """Try each callback due now; returns how many were tried."""
        due = self.queue.callbacks_due()
        for callback in due:
            if self.stopping:
                break
            self._try(callback)
        return len(due)

    def _try(self, callback: dict) -> None:
        tries = callback["tries"] + 1
        retry_at = time.time() + RETRY_PAUSES_S[tries - 1] if tries <= len(RETRY_PAUSES_S) else None
        try:
            error = post(callback["url"], callback["body"].encode(), self.policy, self.resolver)
        except _Refused as e:
            error, retry_at = f"refused: {e}", None
        except Exception as e:  # noqa: BLE001 - one callback's surprise must not stop the others
            error = f"{type(e).__name__}: {e}"
        self.queue.callback_tried(callback["id"], error, retry_at)
        if error is not None:
            self.log({"job": callback["job"], "callback": redact(callback["url"]), "attempt": tries,
                      "error": one_line(f"callback failed: {error}" + ("" if retry_at else "; given up"))})
