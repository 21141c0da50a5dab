"""rigkit's weights copy against a plain `cp -a` of the same tree, on the same disk, in one run.

Makes a 10-file checkpoint (safetensors-shaped shards + config), then times, in ABBA order
to cancel drift: cp -a into a folder under Docker's data root, rigkit's copy into a fresh
volume, rigkit again into another fresh volume, cp -a again. Then the no-op rerun. Prints
rigkit's throughput as a ratio of cp's (goal >= 0.95, issue #15) and the no-op time (goal < 1 s).
The page cache is dropped before each copy where the machine allows it.

Then what the source checks cost (issue #33, goal < 3% of the copy time): a Hugging Face cache
snapshot (LFS safetensors blobs named by their SHA-256, small files by their git blob hash) copied
by the copier itself into a fresh folder on the same disk, checks on (A) and off (B,
RIGKIT_WEIGHTS_PROOFS=off), in ABBA order twice after one warm-up copy, page cache dropped before each; no Docker, so the helper
container's start does not dilute the difference. `--proofs-only` runs just that part; `--proofs-warm` keeps the
source in the page cache, so the copy is bound by hashing, where a check's CPU cost would show.

Rig to rig (issue #33, `--rig-to-rig`, goal >= 0.9 of rsync): two simulated rigs (two SSH ports); rig A's
volume filled with a checkpoint of --relay-gb (>= 10 GB by default) by the copier; then, ABBA, rigkit's
relay (rigkit.weights.relay: the copier's send on rig A, receive on rig B, pumped through this machine
over the two SSH connections) into a fresh volume, and `rsync -a` over OpenSSH from rig A's volume into
a fresh folder on the same disk (one SSH hop: A to this machine, which here shares rig B's disk; rsync
cannot relay between two remotes), page cache dropped and `sync` counted in each. rsync on rig A is
the host's binary and its one missing library copied into the rig (what `apt-get install rsync` gives).

    .venv/bin/python bench/weights_copy.py [--shard-mb 300] [--proofs-only] [--proofs-dir /tmp/rigkit-bench-proofs]
    .venv/bin/python bench/weights_copy.py --rig-to-rig [--relay-gb 10.7]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402

from rigkit.config.loader import ModelSpec  # noqa: E402
from rigkit.config.schema import ModelConfig
from rigkit.weights.volumes import copy, needs_copy  # noqa: E402
from tests.test_weights import make_checkpoint  # noqa: E402
from tests.test_weights_copier import COPIER  # noqa: E402  (the copier as rigkit ships it, in a file)
from tests.vllm_standin.image import STABLE_TAG, ensure_standin_image  # noqa: E402

SOURCE = Path("/srv/rigkit-bench-weights/model")
SHARDS = 8  # + config.json + tokenizer.json = 10 files


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def model(name: str) -> ModelConfig:
    spec = ModelSpec.model_validate({"image": STABLE_TAG, "weights": {"source": str(SOURCE)}, "gpus": [0], "port": 18999})
    return ModelConfig(name, spec, Path(f"{name}.yml"))


def time_cp(client) -> float:
    root = Path(client.info()["DockerRootDir"]) / "rigkit-bench-cp"
    shutil.rmtree(root, ignore_errors=True)
    dropped = drop_caches()
    started = time.monotonic()
    subprocess.run(["cp", "-a", str(SOURCE), str(root)], check=True)
    subprocess.run(["sync"], check=True)
    seconds = time.monotonic() - started
    shutil.rmtree(root)
    return seconds, dropped


def time_rigkit(client, name: str) -> tuple[float, object]:
    config = model(name)
    for v in client.volumes.list(filters={"name": f"rigkit-weights-{name}"}):
        v.remove(force=True)
    drop_caches()
    started = time.monotonic()
    [report] = copy(client, config)
    return time.monotonic() - started, report


def hub_snapshot(root: Path, shards: int, shard_bytes: int) -> tuple[Path, Path]:
    """models--bench--model/snapshots/<rev>/ of links into ../../blobs/, each blob named as the hub
    names it (hashed while written: the source is written once)."""
    repo = root / "models--bench--model"
    snapshot, blobs = repo / "snapshots" / ("0" * 40), repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for n in range(shards):
        block = hashlib.sha256(b"bench %d" % n).digest() * (1 << 15)  # 1 MiB; each shard its own blob
        text = json.dumps({"w": {"dtype": "BF16", "shape": [shard_bytes // 2], "data_offsets": [0, shard_bytes]}}).encode()
        digest, tmp = hashlib.sha256(), blobs / "incoming"
        with open(tmp, "wb") as f:
            for piece in [struct.pack("<Q", len(text)) + text] + [block] * (shard_bytes // len(block)) + \
                         [block[: shard_bytes % len(block)]]:
                f.write(piece)
                digest.update(piece)
        tmp.rename(blobs / digest.hexdigest())
        (snapshot / f"model-{n + 1:05d}-of-{shards:05d}.safetensors").symlink_to(f"../../blobs/{digest.hexdigest()}")
    for name, data in (("config.json", b'{"model_type": "bench"}'), ("tokenizer.json", b"{}" * 100_000)):
        blob = blobs / hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{blob.name}")
    return repo, snapshot


def time_copier(repo: Path, snapshot: Path, dst: Path, checks: bool, cold: bool = True) -> tuple[float, dict]:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    env = {**os.environ, "RIGKIT_WEIGHTS_PROOFS": "on" if checks else "off"}
    copier = COPIER
    if cold:
        drop_caches()
    else:
        subprocess.run(["sync"], check=True)  # the last copy's writeback is not this one's
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(copier), "copy", str(snapshot), str(dst), str(repo)], env=env,
                         capture_output=True, text=True, check=True).stdout
    seconds = time.monotonic() - started
    result = json.loads(out.strip().splitlines()[-1])
    shutil.rmtree(dst)
    return seconds, result


def proof_cost(folder: Path, shard_mb: int, cold: bool = True) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    repo, snapshot = hub_snapshot(folder / "hub", SHARDS, shard_mb << 20)
    total = sum(p.stat().st_size for p in (repo / "blobs").iterdir())
    print(f"hub snapshot: {SHARDS + 2} files, {total / 1e9:.2f} GB under {folder}")
    time_copier(repo, snapshot, folder / "dst", True, cold)  # warm-up, not counted: the first copy onto fresh space is slower
    runs = [(checks, *time_copier(repo, snapshot, folder / "dst", checks, cold)) for checks in (True, False, False, True) * 2]
    on = [s for checks, s, _ in runs if checks]
    off = [s for checks, s, _ in runs if not checks]
    assert all(r["proven"].get("hub-sha256") == SHARDS for checks, _, r in runs if checks), runs
    assert all(r["proven"] == {"copied-sha256": SHARDS + 2} for checks, _, r in runs if not checks), runs
    print(f"page cache dropped before each copy: {cold and drop_caches()}")
    print("copier, ABBA twice: " + ", ".join(f"{'on' if c else 'off'} {s:.2f} s" for c, s, _ in runs))
    ratio = sum(on) / sum(off)
    print(f"source checks on / off: {ratio:.3f} ({(ratio - 1) * 100:+.1f}% copy time; goal < +3%, issue #33); "
          f"{total / 1e6 / (sum(on) / len(on)):.0f} MB/s with the checks, {total / 1e6 / (sum(off) / len(off)):.0f} without")
    shutil.rmtree(folder)


RELAY_ROOT = Path("/srv/rigkit-bench-relay")
RELAY_RIGS = (("rigkit-bench-relay-a", 2251), ("rigkit-bench-relay-b", 2252))
RELAY_VOLUMES = ("rigkit-weights-bench-relay-a", "rigkit-weights-bench-relay-b")


def ssh_client(port: int):
    import paramiko

    from rigkit.plumbing.ssh import gcm_first_transport
    from tests.simrig.rig import ssh_keypair

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a simulated rig made for this run
    client.connect("127.0.0.1", port=port, username="root", key_filename=str(ssh_keypair()), allow_agent=False,
                   look_for_keys=False, timeout=30, transport_factory=gcm_first_transport)  # as group_data/all.py
    return client


def install_rsync(rig) -> None:
    """rsync on the simulated rig A (Debian 12, as this machine): the binary and libpopt, its one library missing there."""
    popt = subprocess.run(["sh", "-c", "ldd /usr/bin/rsync | awk '/libpopt/ {print $3}'"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for path, target in (("/usr/bin/rsync", "/usr/bin/rsync"), (popt, "/usr/lib/x86_64-linux-gnu/libpopt.so.0")):
        subprocess.run(["docker", "cp", "-L", path, f"{rig.name}:{target}"], check=True)
    code, out = rig.exec("rsync --version | head -1")
    assert code == 0, out


def checkpoint_folder(shards: int) -> Path:
    """RELAY_ROOT/src-<shards>: `shards` shards of 1 GiB, made once (`--relay-prepare` makes it
    without Docker, before the run takes the engine); removed once rig A's volume holds it."""
    folder = RELAY_ROOT / f"src-{shards}"
    if not (folder / "config.json").exists():  # make_checkpoint writes it last
        shutil.rmtree(folder, ignore_errors=True)
        make_checkpoint(folder, shards=shards, shard_bytes=1 << 30)
    return folder


def openssh_commands():
    """The two `ssh` commands rigkit's relay joins the rigs with, from host data as an inventory gives it
    (rigkit/plumbing/ssh.py)."""
    from types import SimpleNamespace

    from rigkit.config.inventory import ssh_target
    from rigkit.plumbing.ssh import openssh_command
    from tests.simrig.rig import ssh_keypair

    data = {"ssh_user": "root", "ssh_key": str(ssh_keypair()), "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "off"}
    return tuple(openssh_command(ssh_target(SimpleNamespace(name="127.0.0.1", data={**data, "ssh_port": port})))
                 for _, port in RELAY_RIGS)


def time_relay(client, transports, model, chunk_bytes: int) -> tuple[float, dict]:
    from rigkit.weights.relay import relay

    for v in client.volumes.list(filters={"name": RELAY_VOLUMES[1]}):
        v.remove(force=True)
    client.volumes.create(RELAY_VOLUMES[1])
    drop_caches()
    started = time.monotonic()
    report = relay(transports[0], model, "bench-a", chunk_bytes, openssh_commands())
    return time.monotonic() - started, report


def time_rsync(client, source_dir: str, port: int) -> float:
    from tests.simrig.rig import ssh_keypair

    for v in client.volumes.list(filters={"name": "rigkit-bench-rsync"}):
        v.remove(force=True)
    target = client.volumes.create("rigkit-bench-rsync").attrs["Mountpoint"]
    drop_caches()
    ssh = (f"ssh -p {port} -i {ssh_keypair()} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o LogLevel=ERROR")
    started = time.monotonic()
    subprocess.run(["rsync", "-a", "--exclude", ".rigkit", "-e", ssh, f"root@127.0.0.1:{source_dir}/", f"{target}/"],
                   check=True)
    subprocess.run(["sync"], check=True)
    return time.monotonic() - started


def rig_to_rig(relay_gb: float, chunk_bytes: int) -> None:
    from rigkit.config.schema import ModelSpec as Spec
    from tests.simrig.rig import SimRig

    ensure_standin_image()
    client = docker.from_env()
    rigs = [SimRig(name=name, ssh_port=port).start(log=lambda m: print(m, file=sys.stderr)) for name, port in RELAY_RIGS]
    try:
        install_rsync(rigs[0])
        shards = max(1, round(relay_gb * 1e9 / (1 << 30)))
        src = checkpoint_folder(shards)
        for v in client.volumes.list(filters={"name": RELAY_VOLUMES[0]}):
            v.remove(force=True)
        source_dir = client.volumes.create(RELAY_VOLUMES[0]).attrs["Mountpoint"]
        copier = COPIER
        subprocess.run([sys.executable, str(copier), "copy", str(src), source_dir], check=True, capture_output=True)
        shutil.rmtree(src)  # the disk holds rig A's volume and one copy at a time
        total = sum(p.stat().st_size for p in Path(source_dir).rglob("*") if p.is_file() and ".rigkit" not in p.parts)
        print(f"rig A's volume: {total / 1e9:.2f} GB; chunks of {chunk_bytes >> 20} MiB")
        spec = Spec.model_validate({"image": STABLE_TAG, "gpus": [0], "port": 18999,
                                    "weights": {"source": {"rig": "bench-a", "volume": RELAY_VOLUMES[0]},
                                                "volume": RELAY_VOLUMES[1]}})
        model_b = ModelConfig("bench-relay-b", spec, Path("bench-relay-b.yml"))
        ssh = [ssh_client(port) for _, port in RELAY_RIGS]
        transports = [c.get_transport() for c in ssh]
        print("SSH ciphers: rigkit's relay, OpenSSH with AES-GCM first; rsync, OpenSSH's default")
        runs = []
        for which in ("relay", "rsync", "rsync", "relay"):
            if which == "relay":
                seconds, report = time_relay(client, transports, model_b, chunk_bytes)
                assert report["received_bytes"] == total, report
                which = f"relay ({report['sent_from']} to {report['volume_path']})"
            else:
                seconds = time_rsync(client, source_dir, RELAY_RIGS[0][1])
            runs.append((which, seconds))
            print(f"  {which}: {seconds:.1f} s ({total / 1e6 / seconds:.0f} MB/s)", flush=True)
        relay_s = sum(s for w, s in runs if w.startswith("relay")) / 2
        rsync_s = sum(s for w, s in runs if w == "rsync") / 2
        print(f"page cache dropped before each copy: {drop_caches()}")
        print(f"rig to rig, ABBA: rigkit relay {total / 1e6 / relay_s:.0f} MB/s, rsync {total / 1e6 / rsync_s:.0f} MB/s; "
              f"throughput ratio rigkit / rsync: {rsync_s / relay_s:.2f} (goal >= 0.9, issue #33)")
        for c in ssh:
            c.close()
    finally:
        for name in (*RELAY_VOLUMES, "rigkit-bench-rsync"):
            for v in client.volumes.list(filters={"name": name}):
                v.remove(force=True)
        for rig in rigs:
            rig.remove()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rig-to-rig", action="store_true", help="only rig A's volume into rig B's, against rsync")
    parser.add_argument("--relay-gb", type=float, default=10.7, help="rig to rig: the checkpoint's size (GB)")
    parser.add_argument("--relay-prepare", action="store_true", help="rig to rig: only make the checkpoint (no Docker)")
    parser.add_argument("--relay-chunk-mb", type=int, default=64, help="rig to rig: the receiver's chunk (MiB)")
    parser.add_argument("--shard-mb", type=int, default=300)
    parser.add_argument("--proofs-only", action="store_true", help="only the source checks' cost (no Docker)")
    parser.add_argument("--proofs-dir", type=Path, default=Path("/tmp/rigkit-bench-proofs"))
    parser.add_argument("--proofs-warm", action="store_true",
                        help="keep the source in the page cache: the copy is bound by hashing, where checks would show")
    args = parser.parse_args()
    if args.relay_prepare:
        checkpoint_folder(max(1, round(args.relay_gb * 1e9 / (1 << 30))))
        return
    if args.rig_to_rig:
        rig_to_rig(args.relay_gb, args.relay_chunk_mb << 20)
        return
    if args.proofs_only:
        proof_cost(args.proofs_dir, args.shard_mb, cold=not args.proofs_warm)
        return
    ensure_standin_image()
    client = docker.from_env()
    shutil.rmtree(SOURCE.parent, ignore_errors=True)
    make_checkpoint(SOURCE, shards=SHARDS, shard_bytes=args.shard_mb << 20)
    total = sum(p.stat().st_size for p in SOURCE.rglob("*") if p.is_file())
    files = sum(1 for p in SOURCE.rglob("*") if p.is_file())
    print(f"checkpoint: {files} files, {total / 1e9:.2f} GB")

    cp1, dropped = time_cp(client)
    r1, rep1 = time_rigkit(client, "bench-a")
    r2, rep2 = time_rigkit(client, "bench-b")
    cp2, _ = time_cp(client)
    cp_s, rigkit_s = (cp1 + cp2) / 2, (r1 + r2) / 2
    print(f"page cache dropped before each copy: {dropped}")
    print(f"cp -a:        {cp1:.2f} s, {cp2:.2f} s  -> {total / 1e6 / cp_s:.0f} MB/s")
    print(f"rigkit copy:  {r1:.2f} s, {r2:.2f} s  -> {total / 1e6 / rigkit_s:.0f} MB/s "
          f"(helper's own figure: {rep1.mb_per_s:.0f}, {rep2.mb_per_s:.0f} MB/s)")
    print(f"throughput ratio rigkit / cp -a: {cp_s / rigkit_s:.2f} (goal >= 0.95, issue #15)")

    noop = []
    for _ in range(3):
        started = time.monotonic()
        assert not needs_copy(client, model("bench-a"))
        noop.append(time.monotonic() - started)
    print(f"no-op rerun (metadata check, helper container included): "
          f"{', '.join(f'{s:.2f}' for s in noop)} s (goal < 1 s)")
    for name in ("bench-a", "bench-b"):
        for v in client.volumes.list(filters={"name": f"rigkit-weights-{name}"}):
            v.remove(force=True)
    shutil.rmtree(SOURCE.parent)
    proof_cost(args.proofs_dir, args.shard_mb, cold=not args.proofs_warm)


if __name__ == "__main__":
    main()
