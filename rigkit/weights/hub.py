"""Weights from a Hugging Face Hub repository at a pinned commit (`weights.hub`), downloaded on the rig.

huggingface_hub, the Hub's own client, does the download: it resumes a cut file with a Range request
and names each blob in its cache by the hash the Hub gives for it (the LFS file's SHA-256, a git file's
blob SHA-1). It checks only sizes, so the bytes are proven afterwards by the copier, which copies the
snapshot folder onto the volume as it copies any Hugging Face cache (`hub-sha256`, `git-blob-sha1`:
docs/weights.md): a blob that does not hash to its name is refused and never reaches the volume.

It runs in a short-lived container of the model's helper image (the serving image by default: vLLM's
images carry huggingface_hub), with the rig's cache folder mounted and the host's network (the only
helper that has one). A token (`hub_token_file`) reaches that container as a file put into it before it
starts: never in its environment, its command line, `docker inspect`, or anything printed.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.serving.api_key import read_key_file
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, weights_helper_name
from rigkit.weights.layout import helper_image


class HubError(Exception):
    pass


DOWNLOAD_TIMEOUT_S = 12 * 3600  # hundreds of GB on a home line still end; a stalled one is cut by the client
LOG_TAIL_LINES = 20  # what is read of the container's output: its report is the last line on stdout
OUTPUT_MAX_BYTES = 64 * 1024  # and at most this much of it (a line may be long: the client's warnings quote servers)
STOP_S = 30
TOKEN_PATH = "/run/secrets/hub-token"  # in the download's container, put there before it starts
CACHE_IN_CONTAINER = "/hub"

# Runs as `python3 -c` in the helper image; standard library plus huggingface_hub. Its last line on stdout is its
# report. After the download it checks the snapshot against the hub's listing of the commit (trees/<commit>.json,
# written by the client from the hub's answer): every file there, each a link to the blob named by the hash the
# listing gives (an LFS file's SHA-256, else its git blob id), no other file; the copier then proves each blob's
# bytes against that name. A file that is not such a link (a cache on a filesystem without links, a file put by
# hand) would be proven by nothing: refused.
SCRIPT = r'''
import glob, json, os, shutil, signal, sys, time
repo, revision, cache, token_path, cache_shown = sys.argv[1:6]
SPARE_BYTES = 1024 ** 3
started = time.monotonic()
def report(**fields):
    print(json.dumps(fields), flush=True)
def stop(*_):
    raise SystemExit(143)  # `docker stop`: unwind, so the client removes its partial file
signal.signal(signal.SIGTERM, stop)
token = False
if os.path.exists(token_path):
    with open(token_path) as f:
        token = f.read().strip()
    os.remove(token_path)  # read once; it stays nowhere on the rig
try:
    from huggingface_hub import snapshot_download
except ImportError as exc:
    report(status="error", error=f"the helper image has no huggingface_hub ({exc}); set weights.helper_image "
           "to an image that has it (vLLM's images do)")
    sys.exit(3)
try:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
except ImportError:  # before huggingface_hub 0.26 they lived in utils
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
org, name = repo.split("/")
storage = os.path.join(cache, f"models--{org}--{name}")
for partial in glob.glob(os.path.join(glob.escape(storage), "blobs", "*.incomplete")):
    os.remove(partial)  # a killed download's: the client names each anew and never takes one up again
try:
    # Room first: the cache is on the rig's root filesystem by default, and a full one breaks more than this.
    from huggingface_hub import HfApi
    blobs = os.path.join(storage, "blobs")
    need = sum(f.size for f in HfApi().list_repo_tree(repo, revision=revision, recursive=True, token=token)
               if isinstance(getattr(f, "size", None), int) and hasattr(f, "blob_id")
               and not os.path.exists(os.path.join(blobs, f.lfs.sha256 if f.lfs else f.blob_id)))
    os.makedirs(cache, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if need + SPARE_BYTES > free:
        report(status="error", error=f"the rig's cache {cache_shown} has {free / 1e9:.2f} GB free; the download "
               f"needs {need / 1e9:.2f} GB more and {SPARE_BYTES / 1e9:.0f} GB to spare (and its copy onto the volume "
               "as much again where Docker keeps its data on the same disk). Free space there, or set weights.hub.cache "
               "to a folder on a larger disk")
        sys.exit(5)
    folder = snapshot_download(repo, revision=revision, cache_dir=cache, token=token)
except RevisionNotFoundError:
    report(status="error", error=f"the hub has no commit {revision} in {repo}")
    sys.exit(4)
except (RepositoryNotFoundError, GatedRepoError) as exc:
    gated = isinstance(exc, GatedRepoError) and getattr(getattr(exc, "response", None), "status_code", 0) == 403
    report(status="error", error=f"the hub did not give {repo} to this rig: " + (
        "it is gated and the token's account has not accepted its terms (accept them on the hub)" if gated else
        "it does not exist, or it is gated or private and " + ("the token (hub_token_file) is not allowed it"
                                                               if token else "no token was given (set hub_token_file "
                                                               "in the rig file)")))
    sys.exit(4)
except Exception as exc:
    report(status="error", error=f"{type(exc).__name__}: {str(exc)[:400]}")
    sys.exit(4)
try:
    with open(os.path.join(storage, "trees", f"{revision}.json")) as f:
        listing = json.load(f)["files"]
except (OSError, ValueError, KeyError, TypeError) as exc:
    report(status="error", error=f"the hub's listing of {revision} is not in the cache ({exc}): cannot prove the files")
    sys.exit(4)
wrong, files, size = [], 0, 0
for root, _, names in os.walk(folder):
    for leaf in names:
        full = os.path.join(root, leaf)
        path = os.path.relpath(full, folder)
        entry = listing.get(path) if isinstance(listing, dict) else None
        want = (entry.get("lfs_sha256") or entry.get("blob_id")) if isinstance(entry, dict) else None
        blob = os.path.basename(os.readlink(full)) if os.path.islink(full) else None
        if want is None:
            wrong.append(f"{path}: not in the hub's listing of the commit")
        elif blob != want:
            wrong.append(f"{path}: " + (f"links to blob {blob}, the listing says {want}" if blob else
                                        "not a link to a blob named by its hash (nothing would prove it)"))
        files += 1
        size += os.path.getsize(full)
missing = sorted(set(listing) - {os.path.relpath(os.path.join(r, n), folder) for r, _, ns in os.walk(folder) for n in ns})
wrong += [f"{p}: in the hub's listing, not downloaded" for p in missing[:5]]
if wrong:
    report(status="error", error="the snapshot is not the hub's commit: " + "; ".join(wrong[:5]))
    sys.exit(4)
report(status="ok", files=files, bytes=size, seconds=round(time.monotonic() - started, 3))
'''


def read_hub_token(rig: RigConfig) -> str | None:
    """The rig's Hugging Face token from `hub_token_file` (mode 600, beside the rig file when relative), or None."""
    if not rig.spec.hub_token_file:
        return None
    path = Path(rig.file).parent / Path(rig.spec.hub_token_file).expanduser()
    return read_key_file(path, f"{rig.file}: hub_token_file")


def download_name(model: ModelConfig) -> str:
    return weights_helper_name(model, "download")


def _token_archive(token: str) -> bytes:
    """TOKEN_PATH's folder (mode 700) and the token (mode 400), root's, as a tar to put under /run."""
    buffer = io.BytesIO()
    data = token.encode()
    folder, name = TOKEN_PATH.removeprefix("/run/").split("/")
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(folder)
        info.type, info.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(info)
        info = tarfile.TarInfo(f"{folder}/{name}")
        info.size, info.mode = len(data), 0o400
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _remove(client, name: str) -> None:
    """Stop (SIGTERM first: the client then removes its partial file) and remove the download's container; a
    failure here is said by what follows, never in place of the download's own error."""
    import docker

    try:
        container = client.containers.get(name)
        if container.status == "running":
            container.stop(timeout=STOP_S)
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except Exception:  # noqa: BLE001 (a broken connection: the download's error, or the next deploy, says it)
        pass


def download(client, model: ModelConfig, token: str | None) -> dict:
    """Download the model's hub repository at its commit into the rig's cache; its report
    ({files, bytes, seconds}). A download cut off is resumed by the next (huggingface_hub keeps
    `.incomplete` blobs and asks for the rest). `client`: the rig's Docker Engine (docker SDK)."""
    import docker  # the docker SDK, imported only where a download runs
    import requests

    hub = model.spec.weights.hub
    name = download_name(model)
    _remove(client, name)  # a download a killed deploy left: one download of a model at a time, this one goes on
    # Shared blobs off: huggingface_hub 2.x would link a Xet-downloaded blob to a store outside the model's folder,
    # which the copier (it mounts that folder alone) could neither follow nor prove. Xet's own chunk cache is kept
    # in the rig's cache, so a download cut off does not start over. What an image sets for itself (offline mode,
    # hf_transfer) does not apply here.
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_HUB_DISABLE_SHARED_BLOBS": "1", "HF_HUB_OFFLINE": "0",
           "HF_HUB_ENABLE_HF_TRANSFER": "0", "HF_XET_CACHE": f"{CACHE_IN_CONTAINER}/.xet"}
    image = helper_image(model)

    def create():
        return client.containers.create(
            image, ["python3", "-c", SCRIPT, hub.repo, hub.revision, CACHE_IN_CONTAINER, TOKEN_PATH, hub.cache],
            entrypoint=[], name=name, environment=env, network_mode="host",
            # `volumes=`, unlike a Mount, makes the cache folder where it is not there yet (root's, mode 755).
            volumes={hub.cache: {"bind": CACHE_IN_CONTAINER, "mode": "rw"}}, labels={WEIGHTS_HELPER_LABEL: model.name})
    try:
        try:
            container = create()
        except docker.errors.ImageNotFound:  # a new rig: its serving step would pull the image only after the weights
            client.images.pull(image)
            container = create()
    except docker.errors.APIError as exc:
        raise HubError(f"{model.name}: the download could not start: {exc.explanation or exc}") from None
    try:
        if token:
            container.put_archive("/run", _token_archive(token))
        container.start()
        status = container.wait(timeout=DOWNLOAD_TIMEOUT_S)
        output = container.logs(stdout=True, stderr=False, tail=LOG_TAIL_LINES)[-OUTPUT_MAX_BYTES:]
        said = container.logs(stdout=False, stderr=True, tail=LOG_TAIL_LINES)[-OUTPUT_MAX_BYTES:]
    except requests.exceptions.ReadTimeout:
        raise HubError(f"{model.name}: the download from {hub} did not finish within {DOWNLOAD_TIMEOUT_S} s; the "
                       "files it finished stay in the rig's cache for the next deploy") from None
    except requests.exceptions.RequestException as exc:
        raise HubError(f"{model.name}: the connection to the rig's Docker Engine broke during the download from "
                       f"{hub}: {exc}; the files it finished stay in the rig's cache for the next deploy") from None
    except docker.errors.APIError as exc:
        raise HubError(f"{model.name}: the download could not run: {exc.explanation or exc}") from None
    finally:
        _remove(client, name)
    output, said = output.decode(errors="replace").strip(), said.decode(errors="replace").strip()
    last = output.splitlines()[-1] if output else ""
    try:
        result = json.loads(last)
    except ValueError:
        raise HubError(f"{model.name}: the download from {hub} exited {status.get('StatusCode')} without a report; "
                       f"its last output: {(said or output)[-500:] or '(none)'}") from None
    if result.get("status") != "ok":
        raise HubError(f"{model.name}: weights from {hub}: {result.get('error')}")
    return result
