"""The names this server answers to, and the pages it takes changes from: a request's `Host` must name the server
(the names it listens on, with its port, plus those the operator allows with --allow-host), so that a web page whose
name was rebound to this machine's address (DNS rebinding) reads and changes nothing; and a browser's `Origin`, sent
with anything that changes state, must be one of those names too, so that another site's page cannot submit a form
or open a WebSocket here. Light to import (serve's options check --allow-host with it)."""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Sequence

from ditto_fast.core.checks import refuse

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
_NAME = re.compile(r"[a-z0-9]([a-z0-9_-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9_-]*[a-z0-9])?)*\.?")


def split_host(text: str) -> tuple[str, int | None] | None:
    """A Host header's (or an origin's) name and port: `name`, `name:port`, `[v6]:port`; the name in lower case
    without a trailing dot, an IPv6 address without its brackets. None when it is neither a name nor an address."""
    text = text.strip().lower()
    port: int | None = None
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        name, port_text = address, rest[1:] if rest else None
        if not _address(name):
            return None
    else:
        name, colon, port_text = text.partition(":")
        port_text = port_text if colon else None
        if not (_NAME.fullmatch(name) or _address(name)):
            return None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    return name.rstrip("."), port


def _address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_allow_host(value: object, where: str) -> str:
    """An --allow-host value: a name or address, with or without a port (`news.example`, `news.example:443`,
    `[fd00::5]`); UsageError naming the option otherwise (a ServeOptions field `where` is only ever that option)."""
    if not isinstance(value, str) or split_host(value) is None or "/" in value:
        refuse("--allow-host", f"must be a host name or address, with or without :PORT (e.g. news.example or "
                      f"news.example:443), got {value!r}")
    return value.strip().lower()


class AllowedHosts:
    """The Host values a server answers: the names it listens on with its port (for a loopback --host: 127.0.0.1,
    localhost and [::1]; for 0.0.0.0 or ::, those, this machine's name and any address), plus each --allow-host
    (a name alone: any port; NAME:PORT: that port)."""

    def __init__(self, host: str, port: int, allowed: Sequence[str] = ()):
        self.port = port
        listen = host.strip("[]").lower()
        own = {listen}
        self.any_address = listen in WILDCARDS
        if self.any_address or is_loopback(listen):
            own |= set(LOOPBACK_NAMES)
        if self.any_address:
            own |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        self.own = frozenset(n.rstrip(".") for n in own if n not in WILDCARDS)
        extra = [split_host(a) for a in allowed]
        self.extra = frozenset(e for e in extra if e is not None)

    def allows(self, host: str) -> bool:
        """Whether a Host header (or an origin's host[:port]) names this server."""
        split = split_host(host)
        if split is None:
            return False
        name, port = split
        if (name, port) in self.extra or (name, None) in self.extra:
            return True
        if port != self.port and not (port is None and self.port == 80):
            return False
        return name in self.own or (self.any_address and _address(name))

    def described(self) -> str:
        """The names answered, for a refusal's line."""
        own = sorted(f"[{n}]" if ":" in n else n for n in self.own)
        names = [f"{n}:{self.port}" for n in own] + (["any address"] if self.any_address else [])
        names += sorted((f"[{n}]" if ":" in n else n) + (f":{p}" if p else "") for n, p in self.extra)
        return ", ".join(names)


def is_loopback(name: str) -> bool:
    """Whether --host `name` serves only this machine (localhost, 127.0.0.0/8, ::1)."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def origin_host(origin: str) -> str | None:
    """The host[:port] of an Origin header (`http://name:port`), None for one that is no web origin (`null`, a
    file: or extension page)."""
    scheme, sep, rest = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or "/" in rest or "@" in rest:
        return None
    return rest
