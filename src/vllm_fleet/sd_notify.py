"""sd_notify(3) over $NOTIFY_SOCKET: readiness, status, stopping and watchdog pings."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send ``message`` to systemd; False when not run by systemd (no NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    # An abstract socket is spelled with a leading '@'.
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(target)
        sock.sendall(message.encode())
    return True
