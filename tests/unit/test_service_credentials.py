"""The etcd and NATS credential settings as Dynamo 1.6.1 reads them (bridge/roles/credentials.py),
and the back-off between re-executions after lost leases (bridge/roles/discovery.py). The logins
against real servers are in tests/e2e/test_service_auth.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.roles.credentials import CredentialsError, check_etcd_settings, check_nats_settings
from bridge.roles.discovery import (
    BACKOFF_MAX_S,
    REEXECS_VARIABLE,
    STABLE_S,
    Reexecs,
    back_off_before_reexec,
)

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
TLS = {"ETCD_AUTH_CA": PEM, "ETCD_AUTH_CLIENT_CERT": PEM, "ETCD_AUTH_CLIENT_KEY": PEM}


@pytest.mark.parametrize(
    "environ",
    [{}, {"ETCD_AUTH_USERNAME": "u", "ETCD_AUTH_PASSWORD": "p"}, TLS],
    ids=["none", "user", "tls"],
)
def test_etcd_settings_dynamo_takes(environ: dict[str, str]) -> None:
    check_etcd_settings(environ)


@pytest.mark.parametrize(
    "environ, text",
    [
        ({"ETCD_AUTH_USERNAME": "u"}, "ETCD_AUTH_USERNAME set without ETCD_AUTH_PASSWORD"),
        ({"ETCD_AUTH_PASSWORD": "p"}, "ETCD_AUTH_PASSWORD set without ETCD_AUTH_USERNAME"),
        ({"ETCD_AUTH_CA": PEM}, "without ETCD_AUTH_CLIENT_CERT, ETCD_AUTH_CLIENT_KEY"),
        (
            {**TLS, "ETCD_AUTH_USERNAME": "u", "ETCD_AUTH_PASSWORD": "p"},
            "would ignore the TLS ones",
        ),
        ({**TLS, "ETCD_AUTH_CA": "/etc/etcd/ca.pem"}, "ETCD_AUTH_CA must hold the PEM text"),
    ],
    ids=["user-alone", "password-alone", "ca-alone", "user-and-tls", "a-path"],
)
def test_etcd_settings_dynamo_would_ignore_are_refused(environ: dict[str, str], text: str) -> None:
    with pytest.raises(CredentialsError, match=text):
        check_etcd_settings(environ)


def test_nats_settings(tmp_path: Path) -> None:
    creds = tmp_path / "user.creds"
    creds.write_text("x")
    check_nats_settings({"NATS_AUTH_CREDENTIALS_FILE": str(creds)})
    check_nats_settings({"NATS_SERVER": "tls://a:4222", "NATS_TLS_CA_CERT_PATH": str(creds)})
    with pytest.raises(CredentialsError, match="NATS_AUTH_USERNAME set without"):
        check_nats_settings({"NATS_AUTH_USERNAME": "u"})
    with pytest.raises(CredentialsError, match="not a file this process can read"):
        check_nats_settings({"NATS_AUTH_CREDENTIALS_FILE": str(tmp_path / "missing")})
    with pytest.raises(CredentialsError, match="does not use tls://"):
        check_nats_settings({"NATS_SERVER": "nats://a:4222", "NATS_TLS_INSECURE": "true"})


def test_back_off_doubles_to_its_cap_and_starts_over_after_stable_serving() -> None:
    history, now, waits = Reexecs(), 1000.0, []
    for _ in range(9):
        waits.append(history.backoff_s(now))
        history = history.next(now)
        now += 5.0  # lost again soon after each re-execution
    assert waits == [0, 1, 2, 4, 8, 16, 32, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert history.backoff_s(now + STABLE_S) == 0  # served long enough: at once again
    assert history.next(now + STABLE_S).count == 1


def test_the_count_survives_in_the_environment() -> None:
    environ = {REEXECS_VARIABLE: "not ours"}
    assert Reexecs.from_environ(environ) == Reexecs()
    asyncio.run(back_off_before_reexec(environ))  # the first: no wait
    assert Reexecs.from_environ(environ).count == 1
    asyncio.run(back_off_before_reexec(environ))  # 1 s
    assert Reexecs.from_environ(environ).count == 2
