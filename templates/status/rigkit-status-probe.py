"""rigkit status probe: everything `rigkit status` reads on a Linux rig, in one read-only pass.

Run by the control machine as `python3 -c "<this file>" '<json>'` (rigkit.status.facts); nothing
is installed. Python 3 standard library and rigkit's rig-side runtime (the key file, the probe),
as the deploy shipped it. It writes nothing and starts or stops nothing:
it reads files (sha256 of the stacks' files, the weights volumes' manifests), asks systemd,
journald, nvidia-smi and the docker CLI (ps, inspect, image inspect), and sends each served
model one one-token completion with a deadline (vLLM's /health stays 200 on a stuck engine).
Every command has a time limit (nvidia-smi and docker a short one; `timed_out` names a tool that
ran out of it, and the others are then not asked). Prints one JSON document.

The argument: {"stacks_dir", "gpu_unit", "watchdog_timer", "watchdog_state_dir", "deadline_s",
"gpu_keeper_unit", "gpu_keeper_state", "known_ports": {port: what rigkit listens with there},
"surface_table",
"models": [{"name", "project", "port", "served_model_name", "image", "volume"}]}

The network surface: every TCP socket listening beyond loopback (/proc/net/tcp and tcp6), with the
process that holds it (found by the socket's inode under /proc/*/fd), whether rigkit's firewall table is
loaded and which ports it closes, and, for a port rigkit does not know, what it answers to a plain HTTP
GET without a key at the address it listens on (a status code read from the first line, at most 512
bytes, within 2 s; at most HTTP_PROBES ports, all at once).
"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# The rig-side runtime (rigkit/rigside), shipped by rigkit's rigside role; this folder is
# rigkit.rigside.names.LIB_DIR (tests/test_layout.py keeps them equal).
sys.path.insert(0, os.environ.get("RIGKIT_LIB_DIR", "/usr/local/lib/rigkit"))
sys.dont_write_bytecode = True  # no __pycache__ beside the shipped files (the deploy owns that folder)
try:
    from rigside import atomic, keyfile, names, startup
    from rigside.probe import NoAnswer, one_token
    from rigside.stack import GATE_PENDING_FILE, PROVEN_SETTINGS_FILE, STACK_FILES, STARTUP_FILE, is_sha256
except ImportError as exc:  # a rig rigkit has not deployed yet
    print(json.dumps({"error": f"rigkit's rig-side runtime is not on this rig ({exc}): deploy the rig first"}))
    sys.exit(0)

COMMAND_TIMEOUT_S = 30
JOURNAL_LINES = 15


# A wedged GPU or engine hangs every nvidia-smi or docker call: each has a short limit, and once
# one call to a tool ran out of time the others are not started (`hung`), so a rig with a hung
# GPU or engine answers in about one limit, not one limit per call (rigkit.plumbing.rig_reads).
TOOL_TIMEOUT_S = {"nvidia-smi": 6, "docker": 6}
hung = {}  # tool: "TOOL did not answer within N s"


def run(*command):
    tool = command[0]
    if tool in hung:
        return 124, "", hung[tool]
    limit = TOOL_TIMEOUT_S.get(tool, COMMAND_TIMEOUT_S)
    try:  # on timeout subprocess.run kills the command (SIGKILL) and reaps it: nothing is left running
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    except FileNotFoundError:
        return 127, "", f"{tool} not found"
    except subprocess.TimeoutExpired:
        message = f"{tool} did not answer within {limit} s" if tool in TOOL_TIMEOUT_S else \
            f"{' '.join(command[:3])} did not answer within {limit} s"
        if tool in TOOL_TIMEOUT_S:
            hung[tool] = message
        return 124, "", message
    return done.returncode, done.stdout, done.stderr


def unit(name, journal=True):
    props = {}
    code, out, _ = run("systemctl", "show", name, "-p", "LoadState,UnitFileState,ActiveState,SubState,Result,"
                       "ExecMainStatus,ActiveEnterTimestamp,ExecMainStartTimestamp")
    for line in out.splitlines():
        key, _, value = line.partition("=")
        props[key] = value
    found = {"load": props.get("LoadState"), "enabled": props.get("UnitFileState") or None,
             "active": props.get("ActiveState"), "sub": props.get("SubState"), "result": props.get("Result"),
             "exit_status": props.get("ExecMainStatus"), "started": props.get("ExecMainStartTimestamp") or None}
    if journal:
        code, out, err = run("journalctl", "-b", "-u", name, "--no-pager", "-o", "cat", "-n", str(JOURNAL_LINES))
        found["journal"] = out.splitlines() if code == 0 else []
        found["journal_error"] = None if code == 0 else (err.strip() or f"journalctl exited {code}")
    return found


def driver_version():
    code, out, err = run("nvidia-smi", "--query-gpu=index,driver_version", "--format=csv,noheader")
    if code != 0:
        return None, (out + err).strip() or f"nvidia-smi exited {code}"
    versions = sorted({line.split(",")[1].strip() for line in out.splitlines() if "," in line})
    return ", ".join(versions) or None, None


def containers(project):
    code, out, err = run("docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}")
    if code != 0:
        return None, err.strip() or f"docker ps exited {code}"
    ids = out.split()
    if not ids:
        return [], None
    code, out, err = run("docker", "inspect", *ids)
    if code != 0:
        return None, err.strip()
    found = []
    for c in json.loads(out):
        state = c.get("State", {})
        found.append({"name": c.get("Name", "").lstrip("/"), "status": state.get("Status"),
                      "running": bool(state.get("Running")), "restart_count": c.get("RestartCount", 0),
                      "started_at": state.get("StartedAt"), "image_id": c.get("Image"),
                      "config_image": c.get("Config", {}).get("Image")})
    return found, None


def image(reference):
    code, out, err = run("docker", "image", "inspect", reference)
    if code != 0:
        return {"id": None, "repo_digests": [], "error": (err.strip() or "not on the rig")[-200:]}
    info = json.loads(out)[0]
    return {"id": info.get("Id"), "repo_digests": info.get("RepoDigests") or [], "error": None}


def ready(port, served, key, deadline_s):
    try:
        return {"ok": True, "seconds": round(one_token(port, served, key, deadline_s), 3), "error": None}
    except NoAnswer as exc:
        if exc.no_choices:
            error = "answered without choices"
        elif exc.http_status is not None:
            error = f"HTTP {exc.http_status}"
        else:
            error = f"no completion within {deadline_s} s ({exc.reason})"
        return {"ok": False, "seconds": round(exc.seconds, 3), "error": error}


def load_json(path):
    return atomic.read_json(path)


def read_lines(path):
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def held_candidate(path):
    """The SHA-256 a candidate held for the rollout gate was held under (rigkit-stack's gate.pending), or None."""
    try:
        with open(path) as f:
            text = f.read(100).strip()
    except OSError:
        return None
    return text if is_sha256(text) else None


def parked(state, name):
    """Whether rigkit-ondemand's state (its file, read once per probe) says the model is parked (its engine is not
    asked then)."""
    models = state.get("models") if isinstance(state, dict) else None
    entry = models.get(name) if isinstance(models, dict) else None
    written = state.get("written_at") if isinstance(state, dict) else None
    fresh = isinstance(written, (int, float)) and time.time() - written <= names.ONDEMAND_STATE_STALE_S
    return fresh and isinstance(entry, dict) and entry.get("state") == "parked"


def stack(args, model, ondemand):
    folder = os.path.join(args["stacks_dir"], model["name"])
    settings = load_json(os.path.join(folder, PROVEN_SETTINGS_FILE))
    found = {"deployed": os.path.isdir(folder),
             "files": {name: atomic.sha256(os.path.join(folder, name)) for name in STACK_FILES},
             "held": held_candidate(os.path.join(folder, GATE_PENDING_FILE))}
    found["containers"], found["containers_error"] = containers(model["project"])
    found["catalog_image"] = image(model["image"])
    port = (settings or {}).get("port", model["port"])
    served = (settings or {}).get("served_model_name", model["served_model_name"])
    if model.get("on_demand") and parked(ondemand, model["name"]):
        # asked at its engine's port, a checkpointed engine would hold the completion until the deadline
        found["ready"] = {"ok": None, "seconds": 0.0, "error": "parked by rigkit-ondemand: not asked"}
    else:
        found["ready"] = ready(port, served, keyfile.api_key(settings), args["deadline_s"])
    found["ready"]["port"] = port
    found["startup"] = last_start(folder, found["containers"] or [])
    return found


START_READ_S = 1800  # a start's log is read this far from the container's start: past any ready timeout


def last_start(folder, containers):
    """The running container's start: rigkit-stack's table when it proved that start (with its first token),
    else one read now from the container's log (a start by the rig's boot, the watchdog or Docker's policy:
    no first token measured). None when no single container runs or its log cannot be read."""
    running = [c for c in containers if c.get("running")]
    if len(running) != 1 or not running[0].get("started_at"):
        return None
    try:
        started_at = startup.stamp(running[0]["started_at"])
    except ValueError:
        return None
    kept = load_json(os.path.join(folder, STARTUP_FILE))
    if isinstance(kept, dict) and abs((kept.get("started_at") or 0) - started_at) < 1:
        return {**kept, "proven_by": "rigkit-stack"}
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at + START_READ_S))
    code, out, err = run("docker", "logs", "--timestamps", "--since", running[0]["started_at"], "--until", until,
                         running[0]["name"])
    if code != 0:
        return None
    return {**startup.startup(out + err, started_at), "proven_by": None}


def volume(name):
    code, out, err = run("docker", "volume", "inspect", "--format", "{{.Mountpoint}}", name)
    if "docker" in hung:  # not "missing": the engine did not say
        return {"exists": None, "readable": False, "missing_files": [], "resized_files": [], "error": hung["docker"]}
    if code != 0:
        return {"exists": False, "readable": False, "missing_files": [], "resized_files": []}
    mountpoint = out.strip()
    manifest = load_json(os.path.join(mountpoint, ".rigkit", "manifest.json")) if os.path.isdir(mountpoint) else None
    found = {"exists": True, "readable": os.path.isdir(mountpoint), "manifest_files": None,
             "missing_files": [], "resized_files": []}
    if manifest is None:
        return found
    found["manifest_files"] = len(manifest.get("files", []))
    for entry in manifest.get("files", []):
        path = os.path.join(mountpoint, entry["path"])
        try:
            size = os.stat(path).st_size
        except OSError:
            found["missing_files"].append(entry["path"])
            continue
        if size != entry.get("size"):
            found["resized_files"].append(entry["path"])
    return found


def watchdog_restarts(state_dir, names):
    now = time.time()
    found = {}
    for name in names:
        state = load_json(os.path.join(state_dir, f"{name}.json")) or {}
        found[name] = {"restarts_last_hour": len([t for t in state.get("restarts", []) if now - t < 3600]),
                       "last_restart_reason": state.get("last_restart_reason"),
                       "suspect_since": state.get("suspect_since")}
    return found


def _address(hex_address):
    """/proc/net/tcp's local address (little-endian 32-bit words) as text, and whether it is loopback
    (127.0.0.0/8, ::1, or ::ffff:127.x.y.z)."""
    import ipaddress
    raw = bytes.fromhex(hex_address)
    address = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped and f"::ffff:{mapped}" or address), (mapped or address).is_loopback


def _socket_processes():
    """{socket inode: process name} for every process this user may look into (root: all)."""
    found = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found.setdefault(target[8:-1], name)
    return found


def _http_answer(address, port):
    """The HTTP status a GET / without a key gets at the address the port listens on (a wildcard: that
    family's loopback), or None (not HTTP, no answer within 2 s)."""
    import socket
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)
    host = host[7:] if host.startswith("::ffff:") else host
    try:
        with socket.create_connection((host, port), timeout=2) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\nHost: rig\r\n\r\n")
            first = conn.recv(512).split(b"\r\n", 1)[0].split()
    except OSError:
        return None
    return int(first[1]) if len(first) >= 2 and first[0].startswith(b"HTTP/") and first[1].isdigit() else None


HTTP_PROBES = 32  # ports asked at most, all at once: a rig with many silent listeners still answers in ~2 s


def surface(args):
    listening, processes = {}, None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            address, loopback = _address(hex_address)
            if loopback:
                continue
            processes = _socket_processes() if processes is None else processes
            port = int(hex_port, 16)
            entry = listening.setdefault(port, {"port": port, "addresses": [], "process": None})
            entry["addresses"].append(address)
            entry["process"] = entry["process"] or processes.get(fields[9])
    known = {int(p) for p in args.get("known_ports", {})}
    asked = [e for e in listening.values() if e["port"] not in known and e["process"] != "sshd"][:HTTP_PROBES]
    if asked:
        with ThreadPoolExecutor(max_workers=len(asked)) as pool:
            answers = pool.map(lambda e: _http_answer(e["addresses"][0], e["port"]), asked)
            for entry, answer in zip(asked, answers):
                entry["http_status"] = answer
    code, out, _ = run("nft", "list", "table", "inet", args.get("surface_table", "rigkit_surface"))
    closed = set()
    for line in out.splitlines() if code == 0 else []:
        if "reject" in line and "dport {" in line:
            closed |= {int(p) for p in line.split("{", 1)[1].split("}", 1)[0].replace(",", " ").split() if p.isdigit()}
        elif "reject" in line and "dport " in line:
            closed |= {int(w) for w in line.split("dport ", 1)[1].split()[:1] if w.isdigit()}
    return {"listening": sorted(listening.values(), key=lambda e: e["port"]),
            "firewall": {"loaded": code == 0, "closed_ports": sorted(closed)}}


def gateway_tls(gateway):
    """Whether the gateway on this rig serves the certificate deployed (gateway["cert"], pinned: the leaf
    as trust anchor, any name) and when it expires ("not_after", seconds since the epoch)."""
    import socket
    import ssl
    try:
        from rigside.probe import pinned_file  # here: a runtime from before it loses this check only
    except ImportError:
        return {"error": "the rig's runtime predates the gateway's HTTPS check; `rigkit deploy` updates it"}
    try:
        context = pinned_file(gateway["cert"])
    except (OSError, ssl.SSLError) as exc:
        return {"error": f"the deployed certificate {gateway['cert']} cannot be read ({exc})"}
    try:
        with socket.create_connection((gateway["host"], gateway["port"]), timeout=3) as raw:
            with context.wrap_socket(raw) as tls:
                cert = tls.getpeercert()
    except ssl.SSLCertVerificationError as exc:
        return {"error": f"it serves a certificate other than the one deployed ({exc.verify_message})"}
    except (OSError, ssl.SSLError) as exc:
        return {"error": f"no HTTPS answer at {gateway['host']}:{gateway['port']} ({exc})"}
    return {"not_after": ssl.cert_time_to_seconds(cert["notAfter"]), "issued_by_rigkit": gateway.get("issued_by_rigkit")}


def existing_stacks(stacks_dir):
    try:
        return sorted(d for d in os.listdir(stacks_dir) if os.path.isdir(os.path.join(stacks_dir, d)))
    except OSError:
        return []


def main(argv):
    args = json.loads(argv[1])
    models = args["models"]
    ondemand = load_json(args["ondemand_state"]) if args.get("ondemand_state") else None
    ondemand_read_at = time.time()  # its age is told against when it was read, not when the probe ends
    with ThreadPoolExecutor(max_workers=max(4, len(models) * 2)) as pool:
        stacks = {m["name"]: pool.submit(stack, args, m, ondemand) for m in models}
        volumes = {m["volume"]: pool.submit(volume, m["volume"]) for m in models if m.get("volume")}
        version = pool.submit(driver_version)
        gpu_unit = pool.submit(unit, args["gpu_unit"])
        timer = pool.submit(unit, args["watchdog_timer"], False)
        keeper = pool.submit(unit, args["gpu_keeper_unit"], False) if args.get("gpu_keeper_unit") else None
        surface_found = pool.submit(surface, args)
        tls = pool.submit(gateway_tls, args["gateway_tls"]) if args.get("gateway_tls") else None
        report = {
            "driver_version": version.result()[0], "driver_error": version.result()[1],
            "gpu_unit": gpu_unit.result(),
            "watchdog": {"timer": timer.result(),
                         "models": watchdog_restarts(args["watchdog_state_dir"], [m["name"] for m in models])},
            "stacks": {name: f.result() for name, f in stacks.items()},
            "volumes": {name: f.result() for name, f in volumes.items()},
            "stacks_on_rig": existing_stacks(args["stacks_dir"]),
            "surface": surface_found.result(),
        }
        if tls is not None:
            report["gateway_tls"] = tls.result()
        if keeper is not None:  # the GPU policy keeper's unit and its state file (repairs by cause)
            state = load_json(args["gpu_keeper_state"])
            state = state if isinstance(state, dict) else None
            # A file there that is not a JSON object (cut off, garbage, empty) is said, not read as no repairs.
            report["gpu_keeper"] = {"unit": keeper.result(), "state": state,
                                    "state_unreadable": state is None and os.path.lexists(args["gpu_keeper_state"])}
        if args.get("ondemand_state"):  # rigkit-ondemand's models (loaded, asleep, stopped) and the GPUs it parked
            report["ondemand"] = {"state": ondemand, "now": ondemand_read_at,
                                  "gpus_parked": read_lines(args["gpus_parked"])}
        if args.get("idle_energy"):  # the keeper's idle-energy ledger (rigside.idle_energy), read as it is
            report["idle_energy"] = load_json(args["idle_energy"])
            report["rig_time"] = time.time()  # its hours are the rig's clock's
        report["timed_out"] = dict(hung)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
