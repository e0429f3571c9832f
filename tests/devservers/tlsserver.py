"""A TLS server on loopback that answers nothing: what a TLS endpoint is to a client that speaks plain text.

It completes handshakes (with a self-signed certificate made by ``cryptography``, a dependency of
azure-identity) and closes every connection; a client that sends plain HTTP or AMQP instead has its
connection closed by the failed handshake, as by the Cosmos DB emulator or Service Bus.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tls_server(host: str = "127.0.0.1") -> Iterator[int]:
    """Serve TLS on ``host`` (a loopback address); yields the port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as directory:
        certificate, key = _self_signed(Path(directory))
        context.load_cert_chain(certificate, key)
    listener = socket.create_server((host, 0))
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_handshake, args=(context, connection), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopping.set()
        listener.close()


def _handshake(context: ssl.SSLContext, connection: socket.socket) -> None:
    with contextlib.suppress(OSError), context.wrap_socket(connection, server_side=True) as tls:
        tls.settimeout(5)
        tls.recv(1)
    connection.close()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509  # noqa: PLC0415 - only where a test needs a TLS server
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    certificate_path, key_path = directory / "cert.pem", directory / "key.pem"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return certificate_path, key_path
