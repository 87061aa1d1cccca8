"""TLS for every gRPC socket that carries control: the switch's P4Runtime server, the controller's
P4Runtime client, the job service and its clients.

One configuration, ``TlsConfig``, from the command line (``--tls-ca``, ``--tls-cert``, ``--tls-key``,
``--tls-server-name``) or, field by field where a flag is absent, the environment (``LHC_TLS_CA``,
``LHC_TLS_CERT``, ``LHC_TLS_KEY``, ``LHC_TLS_SERVER_NAME``). What each field means:

- a **client** speaks TLS when it has a CA (``ca``) to verify the server with; with a certificate and key
  as well it presents them when the server asks (mutual TLS). ``server_name`` is the name to find in the
  server's certificate when it is not the host dialled.
- a **server** speaks TLS when it has a certificate and key; one that requires client certificates
  (softswitch given a CA) refuses every client whose certificate that CA did not sign.

Plaintext stays possible (the demo and the tests run on loopback), but a plaintext socket to or on an
address that is not loopback logs a warning: on a real network anyone on the path could read the job
credentials and rewrite the switch's tables.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("lhc.tls")
_LAST_ERROR = re.compile(r"^.*last error: [A-Z_]+: (?:ipv[46]:)?(?:\[[^\]]*\]|[^\s\[]+?):\d+: ")

ENVIRONMENT = {"ca": "LHC_TLS_CA", "cert": "LHC_TLS_CERT", "key": "LHC_TLS_KEY",
               "server_name": "LHC_TLS_SERVER_NAME"}


class TlsError(ValueError):
    """A TLS configuration that cannot work (a missing file, a certificate without its key)."""


@dataclass(frozen=True)
class TlsConfig:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            given, missing = ("cert", "key") if self.key is None else ("key", "cert")
            raise TlsError(f"TLS: a {given} without its {missing} (give --tls-cert and --tls-key together)")

    @classmethod
    def resolve(cls, ca: Path | str | None = None, cert: Path | str | None = None,
                key: Path | str | None = None, server_name: str | None = None,
                environ: Mapping[str, str] = os.environ) -> TlsConfig | None:
        """The flags given, each absent one from the environment; None when neither names anything."""
        given = {"ca": ca, "cert": cert, "key": key, "server_name": server_name}
        values = {name: given[name] or environ.get(var) or None for name, var in ENVIRONMENT.items()}
        if not any(values.values()):
            return None
        paths = {name: Path(values[name]) if values[name] else None for name in ("ca", "cert", "key")}
        return cls(**paths, server_name=values["server_name"])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TlsConfig | None:
        return cls.resolve(environ=environ)

    @property
    def client_secure(self) -> bool:
        """A client verifies its server only with a CA; without one it would have nothing to trust."""
        return self.ca is not None

    @property
    def server_secure(self) -> bool:
        return self.cert is not None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if self.ca is None:
            raise TlsError("TLS: a client needs a CA to verify its server (--tls-ca or LHC_TLS_CA)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "CA"),
            private_key=_read(self.key, "key") if self.key else None,
            certificate_chain=_read(self.cert, "certificate") if self.cert else None,
        )

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """This server's certificate; with ``require_client_cert``, only clients the CA signed get in."""
        if self.cert is None or self.key is None:
            raise TlsError("TLS: a server needs a certificate and its key (--tls-cert and --tls-key)")
        if require_client_cert and self.ca is None:
            raise TlsError("TLS: requiring client certificates needs the CA that signs them (--tls-ca)")
        return grpc.ssl_server_credentials(
            [(_read(self.key, "key"), _read(self.cert, "certificate"))],
            root_certificates=_read(self.ca, "CA") if require_client_cert and self.ca else None,
            require_client_auth=require_client_cert,
        )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"TLS {what} {path}: {exc.strerror or exc}") from None


def host_of(address: str) -> str:
    """The host part of a gRPC target or listen address: ``HOST:PORT``, ``[V6]:PORT``, ``ipv4:A:P``."""
    for scheme in ("ipv4:", "ipv6:", "dns:///", "dns:"):
        if address.startswith(scheme):
            address = address[len(scheme):]
            break
    if address.startswith("["):
        return address[1:].partition("]")[0]
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() else address


def is_loopback(address: str) -> bool:
    """Whether ``address`` stays on this machine: 127/8, ::1, ``localhost``, a unix socket."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = host_of(address)
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: it may resolve anywhere
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def client_channel(address: str, tls: TlsConfig | None,
                   options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A channel to ``address``: TLS when ``tls`` has a CA, else plaintext (a warning off loopback)."""
    options = list(options)
    if tls is not None and tls.client_secure:
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.secure_channel(address, tls.channel_credentials(), options=options)
    if not is_loopback(address):
        log.warning("plaintext gRPC to %s, which is not loopback: anyone on the path can read and change "
                    "it; give a CA (--tls-ca or %s) to use TLS", address, ENVIRONMENT["ca"])
    return grpc.insecure_channel(address, options=options)


def add_port(server: grpc.Server, address: str, tls: TlsConfig | None, *,
             require_client_cert: bool = False) -> int:
    """Listen on ``address`` (TLS with ``tls``'s certificate, else plaintext: a warning off loopback);
    the bound port, 0 when it could not bind."""
    if tls is not None and (tls.server_secure or require_client_cert):  # a CA alone: refused, not plaintext
        credentials = tls.server_credentials(require_client_cert=require_client_cert)
        return server.add_secure_port(address, credentials)
    if not is_loopback(address):
        log.warning("plaintext gRPC server on %s, which is not loopback: anyone on the network can read "
                    "and change its traffic; give --tls-cert and --tls-key (or %s, %s) to use TLS",
                    address, ENVIRONMENT["cert"], ENVIRONMENT["key"])
    return server.add_insecure_port(address)


def last_error(details: str) -> str:
    """The transport's own words from gRPC's UNAVAILABLE details, without the address prefixes."""
    return _LAST_ERROR.sub("", details).strip() or details


def explain_refusal(address: str, tls: TlsConfig | None, details: str) -> str | None:
    """What to fix when gRPC's UNAVAILABLE ``details`` show a TLS handshake that failed, else None. From
    far away a refused handshake looks like an absent server; only the transport's last error differs."""
    lowered = details.lower()
    reason = last_error(details)
    if any(word in lowered for word in ("handshake failed", "certificate_verify_failed", "hostname verif")):
        return (f"the TLS handshake with {address} failed: this client does not accept the server's "
                f"certificate (not signed by the CA {tls.ca if tls else None}, or not issued for the name "
                f"dialled: see --tls-server-name) [{reason}]")
    if "socket closed" in lowered or "connection reset" in lowered:
        if tls is not None and tls.client_secure:
            return (f"{address} closed the connection during the TLS handshake: it refused this client's "
                    "certificate (none given, or not signed by a CA the server trusts: --tls-cert and "
                    f"--tls-key), or it does not speak TLS [{reason}]")
        return f"{address} closed the connection: it may require TLS (give --tls-ca) [{reason}]"
    return None


def mode(tls: TlsConfig | None, *, server: bool, require_client_cert: bool = False) -> str:
    """``plaintext``, ``tls`` or ``mutual``, for ready lines and status."""
    secure = tls is not None and (tls.server_secure if server else tls.client_secure)
    if not secure:
        return "plaintext"
    assert tls is not None
    mutual = require_client_cert if server else tls.cert is not None
    return "mutual" if mutual else "tls"


def add_arguments(
    parser: argparse.ArgumentParser, *, role: Mapping[str, str], dest_prefix: str = "tls"
) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` and, where ``role`` has ``server_name``,
    ``--tls-server-name``; ``role`` says in the help what each means for this program. Each defaults to
    its environment variable (read at ``from_args``)."""
    env = ENVIRONMENT
    parser.add_argument("--tls-ca", dest=f"{dest_prefix}_ca", type=Path, metavar="PEM",
                        help=f"CA certificate(s) that {role['ca']} (env {env['ca']})")
    parser.add_argument("--tls-cert", dest=f"{dest_prefix}_cert", type=Path, metavar="PEM",
                        help=f"certificate chain {role['cert']} (env {env['cert']})")
    parser.add_argument("--tls-key", dest=f"{dest_prefix}_key", type=Path, metavar="PEM",
                        help=f"the certificate's private key (env {env['key']})")
    if "server_name" in role:
        parser.add_argument("--tls-server-name", dest=f"{dest_prefix}_server_name", metavar="NAME",
                            help=f"{role['server_name']} (env {env['server_name']})")


def from_args(args: argparse.Namespace, dest_prefix: str = "tls") -> TlsConfig | None:
    """The configuration from ``add_arguments``' flags, each absent one from the environment."""
    return TlsConfig.resolve(*(getattr(args, f"{dest_prefix}_{name}", None) for name in ENVIRONMENT))
