"""rigkit's key check for the LiteLLM proxy (config.yaml: general_settings.custom_auth).

Clients' keys change without restarting the proxy, so that a rotation fails no request: LiteLLM reads
its master key once at start and keeps other keys only in a database, so this check accepts the master
key (from the environment, as LiteLLM does) and every key whose SHA-256 is listed in client_keys.json
beside config.yaml. `rigkit-gateway keys` replaces that file (one stat() per request notices); a
rotation lists old and new, clients move, then the old one goes. Only hashes are in the file.

LiteLLM 1.103.0 calls this first for every authenticated route, with the key the client sent (the
`Bearer ` prefix stripped); a UserAPIKeyAuth returned is accepted as is (no route check follows), an
exception refuses with its code. The master key reaches every route; a client key only the model routes.
The returned object carries a label, never the key (LiteLLM keeps keys not starting with sk- unhashed).
"""

import hashlib
import hmac
import json
import os

from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth
from litellm.proxy.auth.route_checks import RouteChecks

KEYS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client_keys.json")
MASTER = os.environ.get("LITELLM_MASTER_KEY", "")


class Hashes:
    """The hashes in KEYS_FILE, read again when it changes; a file being replaced keeps the last set."""

    def __init__(self):
        self._stamp, self._hashes = None, frozenset()

    def current(self):
        try:
            info = os.stat(KEYS_FILE)
        except FileNotFoundError:
            self._stamp, self._hashes = None, frozenset()
            return self._hashes
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp != self._stamp:
            try:
                with open(KEYS_FILE) as file:
                    listed = json.load(file).get("sha256", [])
                self._hashes = frozenset(h for h in listed if isinstance(h, str))
                self._stamp = stamp
            except (OSError, ValueError, AttributeError):
                pass
        return self._hashes


HASHES = Hashes()


async def user_api_key_auth(request, api_key):
    sent = (api_key or "").encode()
    digest = hashlib.sha256(sent).hexdigest()
    if MASTER and hmac.compare_digest(sent, MASTER.encode()):
        return UserAPIKeyAuth(api_key="rigkit-master", user_id="rigkit-master", user_role=LitellmUserRoles.PROXY_ADMIN)
    if any(hmac.compare_digest(digest, known) for known in HASHES.current()):
        # LiteLLM checks no route of a key a custom_auth accepted (its common checks are off for them), so a
        # client key would reach the proxy's admin routes too (/health runs a check of every model, /cache/*,
        # /debug/*...): it reaches the model routes only, as LiteLLM classifies them.
        route = request.url.path
        if not RouteChecks.is_llm_api_route(route):
            raise ProxyException(message=f"Authentication Error: a client key reaches the model routes only, not {route}; "
                                 "that route wants the gateway's master key", type="auth_error", param="api_key", code=403)
        return UserAPIKeyAuth(api_key=f"rigkit-client-{digest[:12]}", user_id="rigkit-client",
                              user_role=LitellmUserRoles.INTERNAL_USER)
    raise ProxyException(message="Authentication Error: the key is not one this gateway accepts",
                         type="auth_error", param="api_key", code=401)
