"""pyinfra fact: each model's config.json (the keys rigkit.fit.shape reads) and its weights' bytes, read on the
rig from the folder vLLM will load (read-only; one python3 start for every model)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.fit.shape import KEYS

READ_S = 30  # a config.json and a folder's listing; a hung network mount is given up
CONFIG_MAX_BYTES = 1024 * 1024

SCRIPT = f'''
import glob, json, os, sys
KEYS = {KEYS!r}
def pick(config):
    found = {{k: config[k] for k in KEYS if k in config}}
    if isinstance(found.get("layer_types"), list):
        found["layer_types"] = sorted(set(map(str, found["layer_types"])))[:8]
    if isinstance(config.get("text_config"), dict):
        found["text_config"] = pick(config["text_config"])
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        found["quant_method"] = quant["quant_method"][:64]
    return found
args = sys.argv[1:]
for name, folder in zip(args[::2], args[1::2]):
    out = {{"name": name, "config": None, "weights_bytes": 0}}
    try:
        with open(os.path.join(folder, "config.json"), "rb") as f:
            data = f.read({CONFIG_MAX_BYTES} + 1)
        config = json.loads(data) if len(data) <= {CONFIG_MAX_BYTES} else None
        out["config"] = pick(config) if isinstance(config, dict) else None
    except (OSError, ValueError) as exc:
        out["error"] = str(exc)[:200]
    here = glob.escape(folder)
    files = glob.glob(os.path.join(here, "*.safetensors")) or glob.glob(os.path.join(here, "*.bin"))
    for path in files:
        try:
            out["weights_bytes"] += os.stat(path).st_size
        except OSError:
            pass
    print(json.dumps(out))
'''


class ModelShapes(FactBase):
    """{model name: {"config": the keys of its config.json rigkit.fit.shape reads, or None, "weights_bytes": int}}
    for each (name, folder) pair: the top-level *.safetensors (else *.bin) as vLLM loads them, symlinks followed."""

    def command(self, pairs: tuple[tuple[str, str], ...]) -> str:
        args = " ".join(shlex.quote(part) for pair in pairs for part in pair)
        return f"timeout -k 2 {READ_S} python3 -c {shlex.quote(SCRIPT)} {args} 2>/dev/null; exit 0"

    def process(self, output) -> dict:
        found = {}
        for line in output:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict) and isinstance(answer.get("name"), str):
                found[answer["name"]] = answer
        return found
