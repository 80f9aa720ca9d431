"""Where the embedded Prefect server listens (``--server-host``, ``deploy-local --host``): an address, a
network interface or a host name, whether it must ask for auth there (off loopback: always) and
whether it serves HTTPS (off loopback: unless turned off, never together with auth). The credential
itself is :mod:`espnet3_prefect.server.auth`'s, the certificate :mod:`espnet3_prefect.server.https`'s.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from espnet3_prefect.errors import ConfigError

HOST_VAR = "ESPNET3_PREFECT_SERVER_HOST"
"""Default of ``--server-host``: where the embedded server of a run listens."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) only listens on this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("::1"), is_loopback("10.1.2.3")
    (True, True, True, False)
    """
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_host(host: str) -> str:
    """The address the server binds for ``host``: an address, a network interface name (its IPv4
    address, else its IPv6 one) or a host name (resolved); one line naming ``host`` when it is none of these."""
    host = host.strip()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    interfaces = psutil.net_if_addrs()
    if host in interfaces:
        found = _addresses(interfaces[host])
        if not found:
            raise ConfigError(f"--server-host {host}: the network interface has no IPv4 or IPv6 address")
        return found[0]
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(
            f"--server-host {host}: not an address, a network interface or a host name this machine can resolve"
        ) from None


def _addresses(nics: list) -> list[str]:
    """The IPv4 addresses of one interface's ``psutil`` entries, then its IPv6 ones but link-local
    (those are bound only with the interface named)."""
    v4 = [nic.address for nic in nics if nic.family == socket.AF_INET]
    v6 = [nic.address for nic in nics if nic.family == socket.AF_INET6 and not _link_local(nic.address)]
    return v4 + v6


def _link_local(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_link_local


def interface_addresses() -> list[str]:
    """The IPv4 and IPv6 addresses of this machine's network interfaces (loopback included, IPv6
    link-local not)."""
    return [address for nics in psutil.net_if_addrs().values() for address in _addresses(nics)]


def url_host(address: str) -> str:
    """The host part clients use in the URL: the machine's name for a wildcard bind, IPv6 bracketed.

    >>> url_host("10.0.0.5"), url_host("::1")
    ('10.0.0.5', '[::1]')
    """
    if address in ("0.0.0.0", "::"):
        return socket.getfqdn()
    return f"[{address}]" if ":" in address else address


def auth_required(address: str, auth: bool | None) -> bool:
    """Whether the server on ``address`` runs with auth: ``auth`` when given, else on off loopback.
    Serving beyond loopback without auth is refused.

    >>> auth_required("127.0.0.1", None), auth_required("10.0.0.5", None), auth_required("127.0.0.1", True)
    (False, True, True)
    """
    if auth is None:
        return not is_loopback(address)
    if not auth and not is_loopback(address):
        raise ConfigError(
            f"refusing to serve the Prefect API on {address} without auth: anyone who can reach "
            f"that address could read and change your runs, deployments and parameters "
            f"(drop the --no-auth/--no-server-auth switch, or serve on 127.0.0.1)"
        )
    return auth


def tls_required(address: str, tls: bool | None, auth: bool | None) -> bool:
    """Whether the server on ``address`` serves HTTPS: ``tls`` when given, else off loopback. Turning
    it off beyond loopback is allowed (the documented opt-out) but never together with auth off.

    >>> tls_required("127.0.0.1", None, None), tls_required("10.0.0.5", None, None), tls_required("::1", True, None)
    (False, True, True)
    >>> tls_required("10.0.0.5", False, False)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: refusing to serve the Prefect API on 10.0.0.5 without TLS and without auth:
    anyone on the network could read and change your runs (drop --no-server-tls/--no-tls or
    --no-server-auth/--no-auth)
    """
    if tls is False and auth is False and not is_loopback(address):
        raise ConfigError(
            f"refusing to serve the Prefect API on {address} without TLS and without auth: anyone on "
            f"the network could read and change your runs (drop --no-server-tls/--no-tls or "
            f"--no-server-auth/--no-auth)"
        )
    return (not is_loopback(address)) if tls is None else tls
