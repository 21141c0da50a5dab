"""rigkit's drain filter for the LiteLLM proxy (loaded from config.yaml: litellm_settings.callbacks).

LiteLLM keeps its model list in memory and changes it at run time only through a database, so
`rigkit rollout` drains a rig through this filter instead: it lists the rig in drained.json beside
config.yaml, and from the next request on no deployment of that rig is picked (model_info.rigkit_rig).
The file is read again whenever it changes (one stat() per request). A model whose every replica is
drained keeps them all: a slow answer beats none.
"""

import json
import os

from litellm.integrations.custom_logger import CustomLogger

DRAINED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "drained.json")


class RigkitDrain(CustomLogger):
    def __init__(self):
        super().__init__()
        self._stamp = None
        self._drained = frozenset()

    def drained(self):
        try:
            info = os.stat(DRAINED_FILE)
        except FileNotFoundError:
            self._stamp, self._drained = None, frozenset()
            return self._drained
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp != self._stamp:
            try:
                with open(DRAINED_FILE) as file:
                    self._drained = frozenset(json.load(file).get("rigs", []))
                self._stamp = stamp
            except (OSError, ValueError):
                pass  # a file being replaced: keep the last list, read it again next time
        return self._drained

    async def async_filter_deployments(self, model, healthy_deployments, messages, request_kwargs=None,
                                       parent_otel_span=None):
        drained = self.drained()
        if not drained:
            return healthy_deployments
        kept = [d for d in healthy_deployments if (d.get("model_info") or {}).get("rigkit_rig") not in drained]
        return kept or healthy_deployments


handler = RigkitDrain()
