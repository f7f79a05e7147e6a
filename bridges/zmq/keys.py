"""CURVE keys: generate, load, and enforce the "encrypt off loopback" policy.

Files follow ZeroMQ's certificate format (``zmq.auth.create_certificates``):
``NAME.key`` holds the public key (safe to copy to the peer), ``NAME.key_secret``
holds both keys and is chmod 600. The learner lists the public keys of the robots
it accepts; each robot knows the learner's public key.

Policy: an endpoint that leaves the machine (anything but 127.0.0.0/8, ::1,
localhost, ipc://, inproc://) must use CURVE; plain TCP there needs an explicit,
logged ``allow_insecure=True``. On loopback CURVE is optional.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from robot_rl.core.errors import ConfigError

log = logging.getLogger(__name__)


class InsecureEndpointError(ConfigError):
    """A non-loopback endpoint was configured without CURVE keys (the CLI reports it in one line)."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # z85, 40 bytes
    secret: bytes  # z85, 40 bytes


@dataclass(frozen=True)
class ServerCurve:
    """Learner side: its own key pair and the robots' public keys it accepts.

    ``client_names`` binds a key to the one robot id it may speak for (the key file's name,
    ``robots/NAME.key``): holding robot A's secret key must not let a machine write episodes
    as robot B. A key with no name there may use any robot id.
    """

    keypair: KeyPair
    allowed_clients: frozenset[bytes]
    client_names: Mapping[bytes, str] = field(default_factory=dict)

    @classmethod
    def from_files(cls, secret_file: str | os.PathLike[str],
                   clients: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> ServerCurve:
        """``clients``: a directory of ``NAME.key`` files, or an iterable of key files."""
        names = load_named_public_keys(clients)
        return cls(load_keypair(secret_file), frozenset(names), names)

    def robot_id_refusal(self, client_key: str | bytes | None, robot_id: str) -> str | None:
        """Why ``robot_id`` may not be used by the authenticated ``client_key`` (z85), or None."""
        if client_key is None:
            return "the connection carries no authenticated CURVE key"
        key = client_key.encode() if isinstance(client_key, str) else client_key
        name = self.client_names.get(key)
        if name is not None and name != robot_id:
            return f"the CURVE key of robot {name!r} cannot speak for robot {robot_id!r}"
        return None


@dataclass(frozen=True)
class ClientCurve:
    """Edge side: its own key pair and the learner's public key."""

    keypair: KeyPair
    server_public: bytes

    @classmethod
    def from_files(cls, secret_file: str | os.PathLike[str], server_public_file: str | os.PathLike[str]) -> ClientCurve:
        return cls(load_keypair(secret_file), load_public_key(server_public_file))


# ---------------------------------------------------------------- files


def generate_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write ``name.key`` and ``name.key_secret`` (chmod 600) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = (Path(p) for p in zmq.auth.create_certificates(directory, name))
    os.chmod(secret, 0o600)
    return public, secret


def load_keypair(secret_file: str | os.PathLike[str]) -> KeyPair:
    public, secret = zmq.auth.load_certificate(secret_file)
    if secret is None:
        raise ValueError(f"{secret_file} holds no secret key; pass the NAME.key_secret file, not NAME.key")
    mode = os.stat(secret_file).st_mode & 0o077
    if mode:
        log.warning("secret key %s is readable by group/others (mode %o); chmod 600 it", secret_file, mode)
    return KeyPair(public=public, secret=secret)


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    public, _ = zmq.auth.load_certificate(path)
    return public


def load_public_keys(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[bytes]:
    """Public keys from a directory of ``*.key`` files or from a list of files."""
    return list(load_named_public_keys(source))


def load_named_public_keys(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> dict[bytes, str]:
    """{public key: robot id} from ``NAME.key`` files (a directory of them or a list of files)."""
    if isinstance(source, (str, os.PathLike)):
        directory = Path(source)
        if not directory.is_dir():
            raise ValueError(f"{directory} is not a directory of *.key files")
        files = sorted(directory.glob("*.key"))
    else:
        files = [Path(p) for p in source]
    names: dict[bytes, str] = {}
    for file in files:
        key = load_public_key(file)
        if key in names:
            raise ValueError(f"{file} holds the same public key as {names[key]}.key: one key pair per robot")
        names[key] = file.stem
    return names


# ---------------------------------------------------------------- policy


def is_loopback(endpoint: str) -> bool:
    """True if ``endpoint`` cannot leave this machine."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.split(";")[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", interface names, DNS names: assume they leave the machine


def check_endpoint_security(endpoint: str, curve: object | None, allow_insecure: bool) -> None:
    """Refuse plain TCP off loopback unless explicitly allowed (then warn)."""
    if curve is not None or is_loopback(endpoint):
        return
    if not allow_insecure:
        raise InsecureEndpointError(
            f"{endpoint} is not a loopback endpoint, so CURVE keys are required: generate them with "
            "`robot-rl keys` and pass curve=..., or set allow_insecure=True on an isolated network"
        )
    log.warning("%s: plain unencrypted TCP off loopback (allow_insecure=True)", endpoint)


# ---------------------------------------------------------------- sockets


def start_authenticator(context: zmq.Context, allowed_clients: Iterable[bytes]) -> ThreadAuthenticator:
    """ZAP handler for ``context``: CURVE clients whose public key is listed get in."""
    allowed = frozenset(allowed_clients)

    class _Allowlist:
        def callback(self, domain: str, client_key: bytes) -> bool:
            if client_key in allowed:
                return True
            log.warning("refused a CURVE client with unlisted public key %s", client_key.decode(errors="replace"))
            return False

    auth = ThreadAuthenticator(context, log=logging.getLogger(__name__ + ".zap"))
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_Allowlist())
    return auth


def apply_server_curve(socket: zmq.Socket, curve: ServerCurve) -> None:
    """Make ``socket`` a CURVE server (call before bind)."""
    socket.curve_secretkey = curve.keypair.secret
    socket.curve_publickey = curve.keypair.public
    socket.curve_server = True


def apply_client_curve(socket: zmq.Socket, curve: ClientCurve) -> None:
    """Make ``socket`` a CURVE client of ``curve.server_public`` (call before connect)."""
    socket.curve_secretkey = curve.keypair.secret
    socket.curve_publickey = curve.keypair.public
    socket.curve_serverkey = curve.server_public
