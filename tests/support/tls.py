"""A TLS front for a local HTTP server: the SDKs send a bearer token only over https, and the local Cosmos server
speaks plain HTTP. Each connection is forwarded byte for byte; the certificate is self-signed, made here."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _certificate(folder: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .sign(key, hashes.SHA256()))
    cert, private = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, private)
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


@contextlib.contextmanager
def tls_front(upstream: str) -> Iterator[str]:
    """An https:// URL on 127.0.0.1 that forwards to ``upstream`` (``http://host:port``), for the ``with`` block."""
    host, port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    address: list[int] = []

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    with tempfile.TemporaryDirectory() as folder:
        context = _certificate(Path(folder))

        async def serve() -> asyncio.Server:
            server = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)
            address.append(server.sockets[0].getsockname()[1])
            started.set()
            return server

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        server = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
        started.wait(10)
        try:
            yield f"https://127.0.0.1:{address[0]}"
        finally:
            loop.call_soon_threadsafe(server.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
