"""What stands between a device and the hub in a real network, small enough to read.

- `private_ca(folder)`: a CA of our own and a certificate it signed for 127.0.0.1 and
  localhost, as a company's internal CA issues one for its hub.
- `TlsProxy`: a TLS-terminating reverse proxy (what nginx or a load balancer does in
  front of the hub): HTTPS outside, plain HTTP to the hub, setting X-Forwarded-Proto
  and appending X-Forwarded-For as `proxy_set_header` does.
- `ConnectProxy`: an HTTP proxy that tunnels `CONNECT host:port` (a corporate egress
  proxy a device must go through); it keeps the targets it was asked for.

Each runs in daemon threads of the test process; `close()` stops it.
"""

import datetime
import http.client
import ipaddress
import select
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Headers about one hop's connection: never passed on (RFC 9110, 7.6.1).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
# The proxy sets these itself: a client's own are dropped, as nginx's proxy_set_header does.
SET_BY_PROXY = {"x-forwarded-proto", "x-forwarded-for", "content-length"}


class PrivateCa:
    """The files of a private CA: its certificate (the bundle a device is given) and the
    hub's certificate and key it signed."""

    def __init__(self, ca_pem, cert_pem, key_pem):
        self.ca_pem, self.cert_pem, self.key_pem = ca_pem, cert_pem, key_pem


def private_ca(folder):
    """Write a private CA and a server certificate for 127.0.0.1 and localhost into folder."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "DeployHub test CA")])
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = _certificate(name, ca_name, key.public_key(), ca_key, ca=False, names=names)
    files = PrivateCa(folder / "ca.pem", folder / "hub.pem", folder / "hub-key.pem")
    files.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def _certificate(subject, issuer, public_key, signing_key, ca, names=()):
    """A certificate valid from an hour ago for a day, with the extensions OpenSSL's strict
    verification wants (key identifiers, key usage)."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
            critical=False,
        )
        .add_extension(_key_usage(ca), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
        builder = builder.add_extension(usage, critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _key_usage(ca):
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


class _Server(ThreadingHTTPServer):
    """A threading HTTP server on a free port of 127.0.0.1, served from a daemon thread."""

    daemon_threads = True

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self):
        self.shutdown()
        self.server_close()


class TlsProxy(_Server):
    """HTTPS on `port` (the private CA's certificate), plain HTTP to the hub's port behind.

    The handshake happens in the connection's own thread, so a client that refuses the
    certificate delays no one; `refused` keeps why each failed handshake failed.
    """

    def __init__(self, upstream_port, ca):
        self.upstream_port = upstream_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(ca.cert_pem, ca.key_pem)
        self.refused = []
        super().__init__(_Forwarder)
        self.url = f"https://127.0.0.1:{self.port}"

    def finish_request(self, request, client_address):
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            self.refused.append(str(error))
            return
        with tls:
            self.RequestHandlerClass(tls, client_address, self)


class _Forwarder(BaseHTTPRequestHandler):
    """Pass each request of a kept client connection to the hub over a kept one of its own."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port)

    def finish(self):
        self.upstream.close()
        super().finish()

    def do_GET(self):
        self._forward()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    def _forward(self):
        """The worker sends bodies with a Content-Length (JSON, multipart): no chunked ones."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in HOP_BY_HOP | SET_BY_PROXY
        }
        headers["X-Forwarded-Proto"] = "https"
        headers["X-Forwarded-For"] = self.client_address[0]
        self.upstream.request(self.command, self.path, body=body or None, headers=headers)
        answer = self.upstream.getresponse()
        content = answer.read()
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)

    def log_message(self, format, *args):
        pass  # the hub logs what matters


class ConnectProxy(_Server):
    """An HTTP proxy that only tunnels: `CONNECT host:port`, then bytes both ways. `seen`
    keeps each CONNECT's target."""

    def __init__(self):
        self.seen = []
        super().__init__(_Tunnel)
        self.url = f"http://127.0.0.1:{self.port}"


class _Tunnel(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_CONNECT(self):
        self.server.seen.append(self.path)
        host, _, port = self.path.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=10)
        except (OSError, ValueError) as error:
            self.send_error(502, f"cannot reach {self.path}: {error}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        with upstream:
            _splice(self.connection, upstream)
        self.close_connection = True

    def do_GET(self):
        self.send_error(405, "This proxy only tunnels (CONNECT)")

    do_POST = do_GET

    def log_message(self, format, *args):
        pass


def _splice(one, other):
    """Copy bytes both ways until either side closes."""
    one.settimeout(None)
    other.settimeout(None)
    peers = {one: other, other: one}
    while True:
        readable, _, _ = select.select(list(peers), [], [])
        for sock in readable:
            data = sock.recv(65536)
            if not data:
                return
            peers[sock].sendall(data)
