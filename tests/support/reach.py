"""Whether one host reaches a URL: "open" (an HTTP answer of any status), "dropped" (no
answer within 3 s: a firewall's drop) or "refused ..." (nothing listens), as seen from inside
that host (a lab container or a Molecule platform)."""

from __future__ import annotations

import shlex
import textwrap

PROBE = textwrap.dedent(
    """
    import socket, sys, urllib.error, urllib.request
    try:
        urllib.request.urlopen(sys.argv[1], timeout=3).read()
        print("open")
    except urllib.error.HTTPError:
        print("open")
    except (socket.timeout, TimeoutError):
        print("dropped")
    except OSError as err:
        reason = getattr(err, "reason", err)
        timed_out = isinstance(reason, (socket.timeout, TimeoutError))
        print("dropped" if timed_out else f"refused {reason}")
    """
)


def probe_command(url: str) -> str:
    """A shell command that prints the outcome (the host needs only python3)."""
    return f"python3 -c {shlex.quote(PROBE)} {shlex.quote(url)}"
