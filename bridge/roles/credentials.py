"""etcd and NATS credentials: the variables Dynamo reads, checked before its runtime starts.

What ai-dynamo-runtime 1.6.1 reads (the names are in the wheel's `_core`; the rules in
lib/runtime/src/transports/etcd.rs `ClientOptions::default` and nats.rs `NatsAuth::default`):

* etcd: `ETCD_AUTH_USERNAME` with `ETCD_AUTH_PASSWORD`; otherwise, all three of `ETCD_AUTH_CA`,
  `ETCD_AUTH_CLIENT_CERT` and `ETCD_AUTH_CLIENT_KEY` for TLS with a client certificate. These
  three hold the **PEM text itself** (`Certificate::from_pem(value)`), not a file's path. The two
  ways exclude each other: with a username set, the TLS variables are ignored.
* NATS: the first of `NATS_AUTH_USERNAME` with `NATS_AUTH_PASSWORD`, `NATS_AUTH_TOKEN`,
  `NATS_AUTH_NKEY`, `NATS_AUTH_CREDENTIALS_FILE` (a path); with none, user "user" password "user".
  TLS: `NATS_SERVER=tls://…`, with `NATS_TLS_CA_CERT_PATH`, `NATS_TLS_CLIENT_CERT_PATH` and
  `NATS_TLS_CLIENT_KEY_PATH` (paths), `NATS_TLS_INSECURE`.

What Dynamo does when they do not fit the server (measured, etcd 3.4 and nats-server 2.9): etcd
with auth and no credentials starts the runtime, then the first watch raises "etcdserver: user
name is empty" as a traceback; a wrong etcd password, or a username for an etcd without auth,
holds the runtime's constructor for about 120 s of retries; NATS with users and no or wrong
credentials raises "Failed to connect to NATS". So, as for reachability (runtime.py), the bridge
checks first and stops with one line naming the variable: half-given or misplaced settings, then
the credentials themselves against the server (etcd through its HTTP gateway, NATS through its
CONNECT), where the bridge can do that without TLS.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .runtime import Service

ETCD_USER = ("ETCD_AUTH_USERNAME", "ETCD_AUTH_PASSWORD")
ETCD_TLS = ("ETCD_AUTH_CA", "ETCD_AUTH_CLIENT_CERT", "ETCD_AUTH_CLIENT_KEY")
NATS_USER = ("NATS_AUTH_USERNAME", "NATS_AUTH_PASSWORD")
NATS_TLS_CLIENT = ("NATS_TLS_CLIENT_CERT_PATH", "NATS_TLS_CLIENT_KEY_PATH")
NATS_TLS = ("NATS_TLS_CA_CERT_PATH", *NATS_TLS_CLIENT, "NATS_TLS_INSECURE")
# Dynamo's NATS login when no NATS_AUTH_* variable is set (nats.rs NatsAuth::default).
NATS_DEFAULT_LOGIN = {"user": "user", "pass": "user"}
_PEM = "-----BEGIN "
# A key etcd's range takes: read access to Dynamo's records is what the runtime needs first.
_DYNAMO_PREFIX = "v1/"


class CredentialsError(Exception):
    """The credentials settings cannot work; str() is the one line to log (runtime.py raises it
    as a RuntimeSettingsError)."""


class ServiceRefused(CredentialsError):
    """etcd or NATS answers but will not take this process's credentials (or lack of them)."""


def _given(environ: Mapping[str, str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if environ.get(name)]


def _pair(environ: Mapping[str, str], names: tuple[str, ...]) -> None:
    """Variables Dynamo reads only together: one without the others is silently ignored."""
    given = _given(environ, names)
    if given and len(given) < len(names):
        missing = [name for name in names if name not in given]
        raise CredentialsError(
            f"{', '.join(given)} set without {', '.join(missing)}: Dynamo uses them only "
            "together and would connect without them"
        )


def check_etcd_settings(environ: Mapping[str, str]) -> None:
    """The ETCD_AUTH_* variables as Dynamo 1.6.1 will take them, or one line saying why not."""
    _pair(environ, ETCD_USER)
    _pair(environ, ETCD_TLS)
    if _given(environ, ETCD_USER) and _given(environ, ETCD_TLS):
        raise CredentialsError(
            "ETCD_AUTH_USERNAME and ETCD_AUTH_CA/_CLIENT_CERT/_CLIENT_KEY are both set: Dynamo "
            "1.6.1 takes one or the other and would ignore the TLS ones; for TLS use the client "
            "certificate alone (etcd's --client-cert-auth takes its CN as the user)"
        )
    for name in _given(environ, ETCD_TLS):
        if _PEM not in environ[name]:
            raise CredentialsError(
                f"{name} must hold the PEM text itself (Dynamo 1.6.1 does not read a file "
                f'from it): {name}="$(cat file.pem)"'
            )


def check_nats_settings(environ: Mapping[str, str]) -> None:
    """The NATS_AUTH_* and NATS_TLS_* variables as Dynamo will take them."""
    _pair(environ, NATS_USER)
    _pair(environ, NATS_TLS_CLIENT)
    for name in ("NATS_AUTH_CREDENTIALS_FILE", "NATS_TLS_CA_CERT_PATH", *NATS_TLS_CLIENT):
        path = environ.get(name)
        if path and not os.access(path, os.R_OK):
            raise CredentialsError(f"{name}={path}: not a file this process can read")
    server = environ.get("NATS_SERVER", "")
    tls = _given(environ, NATS_TLS)
    if tls and not all(s.strip().startswith("tls://") for s in server.split(",")):
        raise CredentialsError(
            f"{', '.join(tls)} set but NATS_SERVER={server or '(unset)'} does not use tls://: "
            "Dynamo refuses TLS settings without it"
        )


# -- etcd ------------------------------------------------------------------------------------


def _etcd_call(
    url: str, body: Mapping[str, object], token: str | None, timeout: float
) -> dict[str, Any]:
    """One call to etcd's v3 JSON gateway: its answer, or its error answer (`error`)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    if token:
        request.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"{}")
    return answer


def _etcd_login(base: str, environ: Mapping[str, str], timeout: float) -> str | None:
    """A token for ETCD_AUTH_USERNAME (None without one), or ServiceRefused."""
    user, password = (environ.get(name) for name in ETCD_USER)
    if not user:
        return None
    body = {"name": user, "password": password or ""}
    answer = _etcd_call(f"{base}/v3/auth/authenticate", body, None, timeout)
    if answer.get("token"):
        return str(answer["token"])
    error = str(answer.get("error", answer))
    if "not enabled" in error:
        raise ServiceRefused(
            f"etcd at {base} has authentication disabled but ETCD_AUTH_USERNAME is set: Dynamo "
            "cannot log in there; enable etcd's auth (docs/security.md) or unset the variable"
        )
    raise ServiceRefused(
        f"etcd at {base} refused ETCD_AUTH_USERNAME={user} with ETCD_AUTH_PASSWORD: {error}"
    )


def check_etcd_login(base: str, environ: Mapping[str, str], timeout: float) -> None:
    """Log in as Dynamo will, then read Dynamo's records: both must be allowed (blocking)."""
    token = _etcd_login(base, environ, timeout)
    prefix = base64.b64encode(_DYNAMO_PREFIX.encode()).decode()
    body = {"key": prefix, "limit": 1, "keys_only": True}
    error = str(_etcd_call(f"{base}/v3/kv/range", body, token, timeout).get("error", ""))
    if "user name is empty" in error:
        raise ServiceRefused(
            f"etcd at {base} requires authentication: set ETCD_AUTH_USERNAME and "
            "ETCD_AUTH_PASSWORD (docs/security.md)"
        )
    if error:
        raise ServiceRefused(
            f"etcd at {base} does not let ETCD_AUTH_USERNAME={environ.get(ETCD_USER[0])} read "
            f"Dynamo's keys ({_DYNAMO_PREFIX}…): {error}; grant its role readwrite on every key "
            "(docs/security.md)"
        )


# -- NATS ------------------------------------------------------------------------------------


def nats_login(environ: Mapping[str, str]) -> tuple[dict[str, str], str] | None:
    """The CONNECT fields Dynamo will log in with and the variables they come from, in Dynamo's
    order; None for an NKey or a credentials file (signing the server's nonce is theirs)."""
    user, password = (environ.get(name) for name in NATS_USER)
    if user and password:
        names = f"NATS_AUTH_USERNAME={user} with NATS_AUTH_PASSWORD"
        return {"user": user, "pass": password}, names
    if environ.get("NATS_AUTH_TOKEN"):
        return {"auth_token": environ["NATS_AUTH_TOKEN"]}, "NATS_AUTH_TOKEN"
    if environ.get("NATS_AUTH_NKEY") or environ.get("NATS_AUTH_CREDENTIALS_FILE"):
        return None
    return NATS_DEFAULT_LOGIN, ""


async def check_nats_login(
    url: str, host: str, port: int, environ: Mapping[str, str], timeout: float
) -> None:
    """Log in to NATS at host:port as Dynamo will (plain nats:// only; over tls:// the server's
    INFO, sent before TLS starts, tells only whether it wants credentials)."""
    login = nats_login(environ)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            info = json.loads((await reader.readline()).decode().removeprefix("INFO "))
            if not info.get("auth_required") or login is None:
                return
            fields, names = login
            if urlsplit(url).scheme == "tls":
                if not names:
                    raise ServiceRefused(_nats_needs_login(url, "it asks for credentials"))
                return
            connect = {"verbose": False, "pedantic": False, "protocol": 1, **fields}
            writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            await writer.drain()
            answer = (await reader.readline()).decode().strip()
        finally:
            writer.close()
    if answer.startswith("-ERR"):
        error = answer.removeprefix("-ERR ").strip("'")
        if not names:
            raise ServiceRefused(_nats_needs_login(url, error))
        raise ServiceRefused(f"NATS at {url} refused {names}: {error}")


def _nats_needs_login(url: str, why: str) -> str:
    return (
        f"NATS at {url} requires authentication ({why}): set NATS_AUTH_USERNAME and "
        "NATS_AUTH_PASSWORD (or NATS_AUTH_TOKEN, NATS_AUTH_NKEY, NATS_AUTH_CREDENTIALS_FILE; "
        "docs/security.md)"
    )


# -- both ------------------------------------------------------------------------------------


async def check_credentials(
    services: list[Service], environ: Mapping[str, str], timeout: float
) -> None:
    """Every service this process needs takes its credentials (after check_reachable): the
    settings first, then a login where the bridge can make one; one line when not."""
    for service in services:
        if service.variable == "ETCD_ENDPOINTS":
            check_etcd_settings(environ)
            # Over https the login needs Dynamo's client certificate: Dynamo's to check.
            if urlsplit(service.value.split(",")[0].strip()).scheme == "http":
                await _on_first_answering(service, environ, timeout, _etcd_login_at)
        else:
            check_nats_settings(environ)
            await _on_first_answering(service, environ, timeout, _nats_login_at)


Login = Callable[["Service", str, int, Mapping[str, str], float], Awaitable[None]]


async def _on_first_answering(
    service: Service, environ: Mapping[str, str], timeout: float, login: Login
) -> None:
    """`login` at the first of the service's addresses that answers (others may be down)."""
    for host, port in service.addresses:
        try:
            await login(service, host, port, environ, timeout)
            return
        except (OSError, TimeoutError, ValueError):  # not answering, or not as etcd/NATS does
            continue


async def _etcd_login_at(
    service: Service, host: str, port: int, environ: Mapping[str, str], timeout: float
) -> None:
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    await asyncio.to_thread(check_etcd_login, base, environ, timeout)


async def _nats_login_at(
    service: Service, host: str, port: int, environ: Mapping[str, str], timeout: float
) -> None:
    await check_nats_login(service.value, host, port, environ, timeout)
