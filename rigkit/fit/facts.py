"""pyinfra fact: each model's config.json (the keys rigkit.sizing.shape reads) and its weights' bytes, read on the
rig from the folder vLLM will load (read-only; one python3 start for every model)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.sizing.shape import KEYS
from rigkit.plumbing.rig_reads import DOCKER_S, bounded

READ_S = 30  # a config.json and a folder's listing; a hung network mount is given up
CONFIG_MAX_BYTES = 1024 * 1024

# The keys of a config.json the fit reads, and its quantization: run on the rig (in SCRIPT) and on the controller
# (rigkit.fit.hub_read, for a hub model not downloaded yet), from this one text.
PICK = '''
def pick(config):
    found = {k: config[k] for k in KEYS if k in config}
    if isinstance(found.get("layer_types"), list):
        found["layer_types"] = sorted(set(map(str, found["layer_types"])))[:8]
    if isinstance(config.get("text_config"), dict):
        found["text_config"] = pick(config["text_config"])
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        found["quant_method"] = quant["quant_method"][:64]
    return found
'''


def pick(config: dict) -> dict:
    namespace = {"KEYS": KEYS}
    exec(PICK, namespace)  # noqa: S102 (rigkit's own text above: the rig runs the same)
    return namespace["pick"](config)


SCRIPT = f'''
import glob, json, os, sys
KEYS = {KEYS!r}
{PICK}args = sys.argv[1:]
for name, folder in zip(args[::2], args[1::2]):
    out = {{"name": name, "config": None, "weights_bytes": 0}}
    if not folder.startswith("/"):  # a volume not there (yet): nothing to read
        print(json.dumps(out))
        continue
    try:
        with open(os.path.join(folder, "config.json"), "rb") as f:
            data = f.read({CONFIG_MAX_BYTES} + 1)
        config = json.loads(data) if len(data) <= {CONFIG_MAX_BYTES} else None
        out["config"] = pick(config) if isinstance(config, dict) else None
    except (OSError, ValueError) as exc:
        out["error"] = str(exc)[:200]
    files = None
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        try:  # the shards vLLM loads: those its index names (a repo may also hold a consolidated copy)
            with open(os.path.join(folder, index), "rb") as f:
                names = json.loads(f.read({CONFIG_MAX_BYTES} * 8)).get("weight_map", {{}}).values()
            files = [os.path.join(folder, n) for n in sorted(set(map(str, names))) if "/" not in n and n[:1] != "."]
            break
        except (OSError, ValueError, AttributeError):
            continue
    if files is None:
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
    """{model name: {"config": the keys of its config.json rigkit.sizing.shape reads, or None, "weights_bytes": int}}
    for each (name, "folder" | "volume", path or volume name): the shards vLLM loads (those the safetensors index
    names, else the top-level *.safetensors, else *.bin), symlinks followed; a volume's folder is its Mountpoint
    (nothing read where it is not there, or where the rig's user may not read Docker's folder)."""

    def command(self, places: tuple[tuple[str, str, str], ...]) -> str:
        args = []
        for name, kind, where in places:
            if kind == "volume":
                folder = (f'"$({bounded("docker", DOCKER_S)} volume inspect --format '
                          f"'{{{{.Mountpoint}}}}' {shlex.quote(where)} 2>/dev/null)\"")
            else:
                folder = shlex.quote(where)
            args += [shlex.quote(name), folder]
        return f"timeout -k 2 {READ_S} python3 -c {shlex.quote(SCRIPT)} {' '.join(args)} 2>/dev/null; exit 0"

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
