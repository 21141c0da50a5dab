"""rigkit's callback in the LiteLLM proxy (loaded from config.yaml: litellm_settings.callbacks): the drain
filter, and the models' keys sent to each replica.

LiteLLM keeps its model list in memory and changes it at run time only through a database, so
`rigkit rollout` drains a rig through this filter instead: it lists the rig in drained.json beside
config.yaml, and from the next request on no deployment of that rig is picked (model_info.rigkit_rig).
A model whose every replica is drained keeps them all: a slow answer beats none.

The key each replica wants is not in config.yaml or the environment (a new one there would recreate the
proxy, failing the requests in flight): `rigkit-gateway up` writes backend_keys.json beside config.yaml
({api_base: key}, root only), and every call to a replica (a request, a retry, a health check) is sent
with its key from there. A rotation changes the file, and the next call sends the new key.

Both files are read again whenever they change (one stat() per call).
"""

import json
import os

from litellm.integrations.custom_logger import CustomLogger

HERE = os.path.dirname(os.path.abspath(__file__))
DRAINED_FILE = os.path.join(HERE, "drained.json")
BACKEND_KEYS_FILE = os.path.join(HERE, "backend_keys.json")


class Watched:
    """One field of a JSON file, read again when the file changes; a file being replaced keeps the last value."""

    def __init__(self, path, field, empty):
        self.path, self.field, self.empty = path, field, empty
        self._stamp, self._value = None, empty

    def current(self):
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._value = None, self.empty
            return self._value
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp != self._stamp:
            try:
                with open(self.path) as file:
                    value = json.load(file).get(self.field, self.empty)
                if isinstance(value, type(self.empty)):
                    self._value, self._stamp = value, stamp
            except (OSError, ValueError, AttributeError):
                pass  # read again next time
        return self._value


class RigkitDrain(CustomLogger):
    def __init__(self):
        super().__init__()
        self.drained = Watched(DRAINED_FILE, "rigs", [])
        self.keys = Watched(BACKEND_KEYS_FILE, "keys", {})

    async def async_filter_deployments(self, model, healthy_deployments, messages, request_kwargs=None,
                                       parent_otel_span=None):
        drained = frozenset(self.drained.current())
        if not drained:
            return healthy_deployments
        kept = [d for d in healthy_deployments if (d.get("model_info") or {}).get("rigkit_rig") not in drained]
        return kept or healthy_deployments

    async def async_pre_call_deployment_hook(self, kwargs, call_type):
        api_base = kwargs.get("api_base")
        key = self.keys.current().get(str(api_base).rstrip("/")) if api_base else None
        if not isinstance(key, str) or kwargs.get("api_key") == key:
            return None
        kwargs["api_key"] = key
        client = kwargs.get("client")
        if client is not None and getattr(client, "api_key", None) != key:
            # The router's cached client was made with the key of config.yaml: LiteLLM makes (and caches) one
            # with this key instead.
            kwargs["client"] = None
        return kwargs


handler = RigkitDrain()
