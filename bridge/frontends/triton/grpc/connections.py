"""How long a gRPC connection may stay, and how its pings are policed: gRPC core's channel
arguments, under tritonserver's flags and defaults.

1,100 connections that sent HTTP/2's preface and SETTINGS and then nothing held every place
under the door's old cap of 1024 (gRPC core refuses connections past
`grpc.max_allowed_incoming_connections`; it has no eviction), so every new client failed while
they stayed (issue 38, finding 4). Now:

- the cap (`--grpc-max-connections`) is by default what the process's open-file limit leaves
  once the HTTP listeners' caps and other files are counted (bridge/server.py; about 16,000
  with a limit of 20,000), so it is the operating system's limit that bounds gRPC connections,
  as in Triton, while the other listeners keep their descriptors (issue 22);
- a connection with no call in flight for `--grpc-max-connection-idle` ms (the bridge's flag:
  Triton has none) is sent a GOAWAY and closed, so connections that sit silent give their
  place back; a client's channel opens a new connection for its next call by itself;
- a connection that never finishes its handshake is closed after the door's handshake
  timeout (grpc/server.py);
- the rest are tritonserver's flags with its defaults: the server's keepalive pings
  (`--grpc-keepalive-time`, `--grpc-keepalive-timeout`, `--grpc-keepalive-permit-without-calls`,
  `--grpc-http2-max-pings-without-data`) find peers gone without a word, the enforcement of
  clients' pings (`--grpc-http2-min-recv-ping-interval-without-data`,
  `--grpc-http2-max-ping-strikes`: a client pinging more often is sent a GOAWAY), and an age
  past which a connection is closed once its calls end or its grace is over
  (`--grpc-max-connection-age`, `--grpc-max-connection-age-grace`; none by default).

All times are milliseconds, as tritonserver's flags take them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MAX_CONNECTION_IDLE_MS = 300_000  # five minutes without a call


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """gRPC core's settings for every connection of the door (module docstring)."""

    keepalive_time_ms: int = 7_200_000  # --grpc-keepalive-time (Triton's default: 2 h)
    keepalive_timeout_ms: int = 20_000  # --grpc-keepalive-timeout
    keepalive_permit_without_calls: bool = False  # --grpc-keepalive-permit-without-calls
    http2_max_pings_without_data: int = 2  # --grpc-http2-max-pings-without-data
    # --grpc-http2-min-recv-ping-interval-without-data
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2  # --grpc-http2-max-ping-strikes
    max_connection_age_ms: int = 0  # --grpc-max-connection-age; 0: none
    max_connection_age_grace_ms: int = 0  # --grpc-max-connection-age-grace; 0: none
    max_connection_idle_ms: int = MAX_CONNECTION_IDLE_MS  # --grpc-max-connection-idle; 0: none

    def check(self) -> None:
        """ValueError naming the flag whose value cannot work."""
        for item in fields(self):
            value = getattr(self, item.name)
            if value < 0:
                raise ValueError(f"{flag_of(item.name)}: {value} is not >= 0")
        if self.keepalive_time_ms == 0 or self.keepalive_timeout_ms == 0:
            raise ValueError("--grpc-keepalive-time and --grpc-keepalive-timeout must be > 0")

    def channel_args(self) -> list[tuple[str, int]]:
        """The channel arguments of grpc.aio.server; a 0 age or idle time sets none (gRPC
        core's default: unlimited)."""
        args = [
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            (
                "grpc.http2.min_ping_interval_without_data_ms",
                self.http2_min_recv_ping_interval_without_data_ms,
            ),
            ("grpc.http2.max_ping_strikes", self.http2_max_ping_strikes),
        ]
        for name, value in (
            ("grpc.max_connection_age_ms", self.max_connection_age_ms),
            ("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms),
            ("grpc.max_connection_idle_ms", self.max_connection_idle_ms),
        ):
            if value:
                args.append((name, value))
        return args


def flag_of(name: str) -> str:
    """The command-line flag of a `ConnectionPolicy` field (tritonserver's names drop `_ms`)."""
    return "--grpc-" + name.removesuffix("_ms").replace("_", "-")
