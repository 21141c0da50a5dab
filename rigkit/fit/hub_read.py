"""What the hub says of a model that is not downloaded yet (`weights.hub`): its config.json's keys and the bytes of
the weights vLLM would load, asked by the controller before anything changes, so that the fit is judged before
the download. The same answer as the rig's read of a folder (rigkit.fit.facts), from the same files: the shards
model.safetensors.index.json names where there is one, else the top folder's *.safetensors (or *.bin).

Over the Hub's HTTP API (the same routes huggingface_hub uses: tree listing, resolve), with the rig's token where
it has one (httpx drops it on a redirect to another host). Everything the hub sends is bounded before it is
decoded: a config.json or index of at most CONFIG_MAX_BYTES (the rig's read's bound), listing pages of at most
PAGE_MAX_BYTES, at most MAX_PAGES of them, READ_TIMEOUT_S per read and READ_DEADLINE_S in all; the listing's next
pages only on the hub's own origin.
"""

from __future__ import annotations

import json
import time

import httpx

from rigkit.config.schema import HubSource
from rigkit.fit.facts import CONFIG_MAX_BYTES, pick

READ_TIMEOUT_S = 15  # for each read
READ_DEADLINE_S = 60  # for the whole question: a hub sending a byte now and then is given up
PAGE_MAX_BYTES = 8 * 1024 * 1024
MAX_PAGES = 50  # 1000 entries a page: a repository of 50,000 files is more than any model's
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class HubReadError(Exception):
    pass


REFUSED = {401: "refused (401): no such repository, or it is gated or private and the token (hub_token_file) is "
                "missing or not allowed it",
           403: "refused (403): the repository is gated and the token's account has not accepted its terms",
           404: "not found (404)"}


def _bounded_json(client: httpx.Client, url: str, limit: int, what: str, deadline: float):
    with client.stream("GET", url) as response:
        if response.status_code != 200:
            raise HubReadError(f"{what}: {REFUSED.get(response.status_code, f'HTTP {response.status_code}')}")
        data = bytearray()
        for chunk in response.iter_raw():  # as sent: identity was asked for, so nothing is inflated past `limit`
            data += chunk
            if len(data) > limit:
                raise HubReadError(f"{what}: more than {limit} bytes")
            if time.monotonic() > deadline:
                raise HubReadError(f"{what}: the hub took more than {READ_DEADLINE_S} s to answer")
    try:
        return json.loads(data), response
    except (ValueError, RecursionError):
        raise HubReadError(f"{what}: not JSON") from None


def _listing(client: httpx.Client, hub: HubSource, deadline: float) -> dict[str, int]:
    """{path: size} of every file at the commit, following the listing's pages (a Link header, as the Hub sends)
    on the hub's own origin only: the token goes nowhere else."""
    sizes, url = {}, f"/api/models/{hub.repo}/tree/{hub.revision}?recursive=true"
    origin = httpx.URL(hub.endpoint)
    for _ in range(MAX_PAGES):
        page, response = _bounded_json(client, url, PAGE_MAX_BYTES, "the file listing", deadline)
        if not isinstance(page, list):
            raise HubReadError("the file listing: not a list")
        sizes.update({e["path"]: e["size"] for e in page if isinstance(e, dict) and e.get("type") == "file"
                      and isinstance(e.get("path"), str) and isinstance(e.get("size"), int)})
        url = response.links.get("next", {}).get("url")
        if not url:
            return sizes
        following = httpx.URL(url)
        if (following.scheme, following.host, following.port) != (origin.scheme, origin.host, origin.port):
            raise HubReadError(f"the file listing: its next page is on another host ({following.host})")
    raise HubReadError(f"the file listing: more than {MAX_PAGES} pages")


def hub_answer(name: str, hub: HubSource, token: str | None) -> dict:
    """{name, config (the keys the fit reads), weights_bytes}, as rigkit.fit.facts answers for a folder."""
    headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {token}"} if token else {})}
    deadline = time.monotonic() + READ_DEADLINE_S
    try:
        with httpx.Client(base_url=hub.endpoint, headers=headers, timeout=READ_TIMEOUT_S, follow_redirects=True,
                          max_redirects=3) as client:
            sizes = _listing(client, hub, deadline)
            config, _ = _bounded_json(client, f"/{hub.repo}/resolve/{hub.revision}/config.json", CONFIG_MAX_BYTES,
                                      "config.json", deadline) if "config.json" in sizes else (None, None)
            shards = None
            for index in INDEXES:
                if index in sizes:
                    mapping, _ = _bounded_json(client, f"/{hub.repo}/resolve/{hub.revision}/{index}",
                                               CONFIG_MAX_BYTES * 8, index, deadline)
                    weight_map = mapping.get("weight_map") if isinstance(mapping, dict) else None
                    names = weight_map.values() if isinstance(weight_map, dict) else ()
                    shards = sorted({n for n in map(str, names) if "/" not in n and n[:1] != "."})
                    break
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # its text names the URL, never a header
        raise HubReadError(f"{hub.endpoint} did not answer: {type(exc).__name__}: {str(exc)[:200]}") from None
    if shards is None:
        top = [p for p in sizes if "/" not in p]
        shards = [p for p in top if p.endswith(".safetensors")] or [p for p in top if p.endswith(".bin")]
    return {"name": name, "config": pick(config) if isinstance(config, dict) else None,
            "weights_bytes": sum(sizes.get(p, 0) for p in shards)}
