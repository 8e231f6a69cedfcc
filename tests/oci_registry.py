"""A real OCI registry for the registry tests: Debian's ``docker-registry`` (the CNCF distribution server, 2.8) on
loopback, started with a config of our own: storage in a temporary directory, deletes enabled, and htpasswd (bcrypt)
auth, or token auth against ``TokenServer``, a small token endpoint of the tests' own (the registry trusts its
self-signed certificate; it answers Docker's token request with an ES256 JWT for the scope asked, after checking
the same user and password; told to, it issues tokens already expired); with ``tls``, HTTPS with a certificate for
127.0.0.1 signed by a CA of the tests' own (``LoopbackCa``). tests/conftest.py loads this module as a plugin:
``oci_registry`` and ``oci_token_registry`` are one server each for the whole session.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

USERNAME = "ci-user"
PASSWORD = "ci-oci-password-0123456789"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10

requires_docker_registry = pytest.mark.skipif(
    shutil.which("docker-registry") is None,
    reason="needs Debian's docker-registry (apt-get install docker-registry; scripts/setup-oci-registry.sh)",
)


SERVICE = "enginesmith-tests"
ISSUER = "enginesmith-tests-token-server"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """TEST DOUBLE for a registry's token service (what Harbor or Docker Hub run beside the registry): GET /token with
    HTTP basic credentials and ``service``/``scope`` parameters answers a JWT granting that scope, signed with a key the
    registry trusts. ``expired`` makes it issue tokens that expired long ago (beyond the registry's leeway)."""

    def __init__(self, work_dir: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = time.time()
        import datetime as dt

        certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                       .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(dt.datetime.fromtimestamp(now - 3600, dt.timezone.utc))
                       .not_valid_after(dt.datetime.fromtimestamp(now + 86400, dt.timezone.utc))
                       .sign(self._key, hashes.SHA256()))
        work_dir.mkdir(parents=True, exist_ok=True)
        self.root_certificate = work_dir / "token-root.pem"
        self.root_certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        der = self._key.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        # libtrust's key id, which distribution matches a token's "kid" against: base32 of 30 bytes of sha256(DER)
        encoded = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
        self._kid = ":".join(encoded[i:i + 4] for i in range(0, len(encoded), 4))
        self.expired = False
        self.issued = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="token-server", daemon=True)

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def token(self, user: str, scopes: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time()) - (3600 if self.expired else 0)
        claims = {"iss": ISSUER, "sub": user, "aud": SERVICE, "iat": now, "nbf": now - 5, "exp": now + 300,
                  "jti": uuid.uuid4().hex, "access": access}
        header = {"typ": "JWT", "alg": "ES256", "kid": self._kid}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        with self._lock:
            self.issued += 1
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                supplied = self.headers.get("Authorization", "")
                expected = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
                if supplied != expected or query.get("service") != [SERVICE]:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": server.token(USERNAME, query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


class LoopbackCa:
    """A certificate authority of the tests' own, and a server certificate it signs for 127.0.0.1 (an IP SAN)."""

    def __init__(self, work_dir: Path) -> None:
        import datetime as dt
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = dt.datetime.now(dt.timezone.utc)
        ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "enginesmith tests CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
              .not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .sign(ca_key, hashes.SHA256()))
        server = (x509.CertificateBuilder()
                  .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                  .issuer_name(ca_name).public_key(server_key.public_key())
                  .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
                  .not_valid_after(now + dt.timedelta(days=1))
                  .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                 critical=False)
                  .sign(ca_key, hashes.SHA256()))
        work_dir.mkdir(parents=True, exist_ok=True)
        self.ca_file = work_dir / "ca.pem"
        self.certificate_file = work_dir / "server.pem"
        self.key_file = work_dir / "server.key"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.certificate_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(server_key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()))
        self.key_file.chmod(0o600)


class OciRegistry:
    """One ``docker-registry serve`` process on 127.0.0.1 with its own storage, and htpasswd or token auth; HTTPS
    with ``tls`` (its CA: ``self.tls.ca_file``)."""

    def __init__(self, work_dir: Path, token_server: TokenServer | None = None, *, tls: bool = False) -> None:
        self.token_server = token_server
        self.tls = LoopbackCa(work_dir / "tls") if tls else None
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.work_dir = work_dir
        self.log_path = work_dir / "registry.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def registry_url(self, namespace: str) -> str:
        return f"{'oci' if self.tls else 'oci+http'}://{self.host}/{namespace}"

    @property
    def env(self) -> dict[str, str]:
        return {"ENGINESMITH_OCI_USERNAME": USERNAME, "ENGINESMITH_OCI_PASSWORD": PASSWORD,
                "DOCKER_CONFIG": str(self.work_dir / "no-docker-config")}

    def start(self) -> None:
        import bcrypt

        self.work_dir.mkdir(parents=True, exist_ok=True)
        htpasswd = self.work_dir / "htpasswd"
        htpasswd.write_text(f"{USERNAME}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
        config = self.work_dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage:\n  filesystem: {{rootdirectory: {self.work_dir / 'data'}}}\n  delete: {{enabled: true}}\n"
            f"http:\n  addr: {self.host}\n  secret: enginesmith-tests\n"
            + (f"  tls: {{certificate: {self.tls.certificate_file}, key: {self.tls.key_file}}}\n" if self.tls else "")
            + (f"auth:\n  htpasswd: {{realm: enginesmith-tests, path: {htpasswd}}}\n" if self.token_server is None
               else f"auth:\n  token: {{realm: {self.token_server.realm}, service: {SERVICE}, issuer: {ISSUER}, "
                    f"rootcertbundle: {self.token_server.root_certificate}}}\n")
        )
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log,
                                             stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"docker-registry exited ({self._process.returncode}):\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                url = f"{'https' if self.tls else 'http'}://{self.host}/v2/"
                verify = ssl.create_default_context(cafile=self.tls.ca_file) if self.tls else True
                if httpx.get(url, timeout=2, verify=verify).status_code == 401:  # up, and asking for auth
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer within {START_TIMEOUT_S} s:\n{self.log_path.read_text()}")

    def upload_sessions(self, namespace: str) -> dict[str, int]:
        """The upload sessions the server's storage holds in ``namespace``'s repositories: each one's id and the bytes
        of its data (0 for a cancelled one whose directory distribution leaves behind)."""
        repositories = self.work_dir / "data" / "docker" / "registry" / "v2" / "repositories" / namespace
        return {session.name: (session / "data").stat().st_size if (session / "data").is_file() else 0
                for session in repositories.glob("**/_uploads/*")}

    def garbage_collect(self) -> str:
        """The registry's own garbage collection, as an operator runs it: the server stopped, ``docker-registry
        garbage-collect`` over its storage, the server started again. Returns what it printed."""
        self.stop()
        swept = subprocess.run(["docker-registry", "garbage-collect", str(self.work_dir / "config.yml")],
                               capture_output=True, text=True, timeout=120)
        if swept.returncode != 0:
            raise RuntimeError(f"docker-registry garbage-collect failed:\n{swept.stdout}{swept.stderr}")
        self.start()
        return swept.stdout + swept.stderr

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


@contextlib.contextmanager
def running_oci_registry(work_dir: Path, *, token_auth: bool = False, tls: bool = False) -> Iterator[OciRegistry]:
    token_server = TokenServer(work_dir) if token_auth else None
    if token_server is not None:
        token_server.start()
    server = OciRegistry(work_dir, token_server, tls=tls)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if token_server is not None:
            token_server.stop()


@pytest.fixture(scope="session", name="oci_registry")
def oci_registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """One docker-registry for the test session; tests use a namespace of their own on it."""
    if shutil.which("docker-registry") is None:
        pytest.skip("needs Debian's docker-registry (apt-get install docker-registry; scripts/setup-oci-registry.sh)")
    with running_oci_registry(tmp_path_factory.mktemp("oci-registry")) as server:
        yield server


@pytest.fixture(scope="session", name="oci_token_registry")
def oci_token_registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """A docker-registry with token auth (``TokenServer``) for the test session."""
    if shutil.which("docker-registry") is None:
        pytest.skip("needs Debian's docker-registry (apt-get install docker-registry; scripts/setup-oci-registry.sh)")
    with running_oci_registry(tmp_path_factory.mktemp("oci-token-registry"), token_auth=True) as server:
        yield server


def write_credential_helper(bin_dir: Path, name: str, answers: dict[str, tuple[str, str]], *,
                            exit_code: int | None = None, output: str | None = None) -> Path:
    """TEST DOUBLE for a Docker credential helper (docker-credential-pass, -secretservice, -ecr-login, …: each talks
    to a keyring or a cloud we do not have here): ``docker-credential-NAME get`` reads a host on stdin and answers
    Docker's credential JSON from ``answers``, or prints "credentials not found in native keychain" and exits 1, as
    the real ones do. ``exit_code``/``output`` force another answer. Each host asked is appended to ``NAME.asked``
    beside it. Returns the program's path; put ``bin_dir`` on PATH."""
    import sys

    bin_dir.mkdir(parents=True, exist_ok=True)
    program = bin_dir / f"docker-credential-{name}"
    asked = bin_dir / f"{name}.asked"
    table = {host: {"ServerURL": host, "Username": user, "Secret": secret} for host, (user, secret) in answers.items()}
    forced = "" if exit_code is None else f"print({output!r}); sys.exit({exit_code})\n"
    program.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"assert sys.argv[1:] == ['get'], sys.argv\nhost = sys.stdin.read().strip()\n"
        f"with open({str(asked)!r}, 'a') as log:\n    log.write(host + '\\n')\n{forced}"
        f"table = {json.dumps(table)!r}\nentry = json.loads(table).get(host)\n"
        "if entry is None:\n    print('credentials not found in native keychain'); sys.exit(1)\n"
        "print(json.dumps(entry))\n"
    )
    program.chmod(0o755)
    return program
