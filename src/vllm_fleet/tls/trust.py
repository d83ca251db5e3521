"""What a fleet client trusts when it calls a fleet listener over HTTPS: the fleet CA alone.

The routers' client port (clients, and the engine hosts adding and removing workers) speaks
HTTPS with each router host's certificate from the fleet CA (role host_tls). A client given
the CA's certificate trusts it and nothing else, not the system's CAs nor certifi's, so a
listener with a certificate from any other CA is refused at the handshake.
"""

from __future__ import annotations

import ssl


class TrustError(Exception):
    """The fleet CA's certificate could not be read (the message names the file)."""


def fleet_trust(url: str, ca_file: str | None) -> ssl.SSLContext | bool:
    """httpx's `verify` for url: the fleet CA alone for https with a CA; the default else.

    An https URL without a CA keeps the system's trust (a listener the fleet does not run);
    plain http ignores it.
    """
    if not (ca_file and url.startswith("https://")):
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise TrustError(f"cannot read the fleet CA {ca_file}: {err}") from err
