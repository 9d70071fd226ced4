"""TCP sockets listening on a port, read from /proc/net/tcp and tcp6 (what `ss -ltn` reads)."""

from __future__ import annotations

from pathlib import Path

# An IPv6 socket on an IPv4-mapped address (grpc binds 127.0.0.1 so): ::ffff:a.b.c.d
_V4_MAPPED = "0000000000000000FFFF0000"
_LISTEN = "0A"


def _address(hex_address: str) -> str:
    if len(hex_address) == 32:  # tcp6
        if not hex_address.startswith(_V4_MAPPED):
            return "::" if set(hex_address) == {"0"} else f"ipv6 {hex_address}"
        hex_address = hex_address[24:]
    return ".".join(str(b) for b in reversed(bytes.fromhex(hex_address)))


def listening(port: int) -> list[tuple[str, str]]:
    """(local address as a.b.c.d, socket inode) of each socket listening on TCP `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6 in this kernel
            continue
        for row in rows:
            fields = row.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == _LISTEN and int(hex_port, 16) == port:
                found.append((_address(address), fields[9]))
    return found


def listening_addresses(port: int) -> set[str]:
    """The local addresses listening on TCP `port`."""
    return {address for address, _ in listening(port)}
