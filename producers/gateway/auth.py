"""Who may publish for which cluster: the gateway's auth file of hashed secrets, and checking credentials.

The file (TOML, `--auth-file`) names each cluster the gateway serves and the hash of its secret:

    [clusters."fox.educloud.no"]
    secret = "pbkdf2-sha256$200000$<salt>$<hash>"      # hpcbus gateway --hash-secret < secret.txt
    sonar_token = "pbkdf2-sha256$..."                  # optional: Sonar's meta.token must match

The cluster of a request comes from its credentials, never from its body: HTTP Basic with the cluster name
as user (what Sonar's HTTP sink and the Slurm profile plugin send, and InfluxDB 1.x's `u`/`p` parameters), or
`Authorization: Token <cluster>:<secret>` (InfluxDB 1.8's form of a v2 token). Hashes are PBKDF2-SHA256 from
the standard library, so a leaked file does not give the secrets away; checking one costs tens of
milliseconds, so it runs in a thread and a secret that checked out once is remembered (as a keyed digest,
bounded) for the requests after it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import tomllib
from collections import OrderedDict

import msgspec

from hpcbus.options import SettingsError
from hpcbus.schemas import subjects

SCHEME = "pbkdf2-sha256"
ITERATIONS = 200_000
"""PBKDF2 rounds of new hashes (OWASP's 2023 advice for SHA-256 is 600,000; a secret here is a random
token, not a person's password, so a third of that costs attackers the same as a long password would)."""

MAX_REMEMBERED = 1024
"""Checked credentials kept in memory (one per cluster and secret in use)."""


class ClusterAuth(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    secret: str
    """Hash of the cluster's secret (Basic password, or the part after `<cluster>:` of a Token)."""
    sonar_token: str = ""
    """Hash of the `meta.token` every Sonar envelope of this cluster must carry ("" = not checked)."""


class AuthFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    clusters: dict[str, ClusterAuth]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """`pbkdf2-sha256$<rounds>$<salt>$<hash>` of `secret` (salt and hash unpadded base64url)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def _parse_hash(hashed: str) -> tuple[int, bytes, bytes]:
    """(rounds, salt, digest); ValueError naming what is wrong."""
    parts = hashed.split("$")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise ValueError(
            f"not a {SCHEME}$<rounds>$<salt>$<hash> string (make one with `hpcbus gateway --hash-secret`)"
        )
    try:
        rounds = int(parts[1])
        salt, digest = _unb64(parts[2]), _unb64(parts[3])
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"unreadable hash ({exc})") from None
    if rounds < 1 or not salt or len(digest) != 32:
        raise ValueError("unreadable hash (rounds, salt or digest length)")
    return rounds, salt, digest


def verify(secret: str, hashed: str) -> bool:
    """Does `secret` match `hashed` (constant-time comparison)."""
    rounds, salt, digest = _parse_hash(hashed)
    return hmac.compare_digest(hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, rounds), digest)


def load_auth_file(path: str) -> dict[str, ClusterAuth]:
    """The clusters of an auth file; `SettingsError` (exit 2) naming the file and the key that is wrong."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"--auth-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"--auth-file {path}: not TOML: {exc}") from None
    try:
        parsed = msgspec.convert(raw, AuthFile)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"--auth-file {path}: {exc}") from None
    if not parsed.clusters:
        raise SettingsError(f'--auth-file {path}: no [clusters."<name>"] table')
    for name, entry in parsed.clusters.items():
        try:
            subjects.metrics(name)
        except subjects.SubjectError as exc:
            raise SettingsError(f"--auth-file {path}: clusters.{name}: {exc}") from None
        for key in ("secret", "sonar_token"):
            value = getattr(entry, key)
            if value or key == "secret":
                try:
                    _parse_hash(value)
                except ValueError as exc:
                    raise SettingsError(f'--auth-file {path}: clusters."{name}".{key}: {exc}') from None
    return parsed.clusters


class Busy(Exception):
    """`max_checks` secrets are being hashed already: the request is answered 503 instead of queueing."""


class Authenticator:
    """The clusters a gateway serves and how their requests prove it. `clusters is None`: open mode, every
    request is for `default` and credentials are not asked for.

    At most `max_checks` secrets that were not seen before are hashed at once: requests with wrong
    secrets cost tens of milliseconds of CPU each and come before any other admission, so without a bound
    a flood of them would queue without limit (memory) and keep good first-time clients waiting behind it.
    Beyond it `cluster_of` raises `Busy` at once; credentials that checked out before are not hashed again
    and pass however busy it is."""

    def __init__(
        self, clusters: dict[str, ClusterAuth] | None, default: str = "", *, max_checks: int = 4
    ) -> None:
        self.entries = clusters
        self.default = default
        self.max_checks = max_checks
        self.checking = 0
        self._key = os.urandom(32)
        self._good: OrderedDict[bytes, None] = OrderedDict()

    @property
    def open(self) -> bool:
        return self.entries is None

    @property
    def clusters(self) -> list[str]:
        return [self.default] if self.entries is None else list(self.entries)

    def remembered(self, what: str, cluster: str, secret: str) -> tuple[bytes, bool]:
        """(key, whether these credentials checked out before); the key is a keyed digest, never the secret."""
        key = hmac.new(self._key, f"{what}\0{cluster}\0{secret}".encode(), "sha256").digest()
        if key in self._good:
            self._good.move_to_end(key)
            return key, True
        return key, False

    def remember(self, key: bytes) -> None:
        """Credentials that checked out (the oldest forgotten beyond `MAX_REMEMBERED`)."""
        self._good[key] = None
        while len(self._good) > MAX_REMEMBERED:
            self._good.popitem(last=False)

    async def cluster_of(self, user: str, secret: str) -> str | None:
        """The cluster these credentials are for, or None when they are not good."""
        if self.entries is None:
            return self.default
        entry = self.entries.get(user)
        if entry is None:
            return None
        key, known = self.remembered("secret", user, secret)
        if known:
            return user
        if self.checking >= self.max_checks:
            raise Busy(f"{self.checking} credential checks in progress")
        self.checking += 1
        try:
            good = await asyncio.to_thread(verify, secret, entry.secret)
        finally:
            self.checking -= 1
        if not good:
            return None
        self.remember(key)
        return user

    def sonar_token_check(self, cluster: str) -> TokenCheck | None:
        """A check of Sonar's `meta.token` for `cluster`, or None when the cluster has no token set."""
        entry = None if self.entries is None else self.entries.get(cluster)
        if entry is None or not entry.sonar_token:
            return None
        return TokenCheck(self, cluster, entry.sonar_token)


class TokenCheck:
    """`check(token)`: synchronous (it runs inside the envelope reader, itself run in a thread)."""

    def __init__(self, auth: Authenticator, cluster: str, hashed: str) -> None:
        self.auth, self.cluster, self.hashed = auth, cluster, hashed

    def __call__(self, token: str) -> bool:
        try:
            token.encode()
        except UnicodeEncodeError:  # a lone surrogate (JSON `\ud800`) cannot be a token, nor be hashed
            return False
        if not token:
            return False
        key, known = self.auth.remembered("sonar", self.cluster, token)
        if known:
            return True
        if verify(token, self.hashed):
            self.auth.remember(key)
            return True
        return False
