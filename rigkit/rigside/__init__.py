"""The rig side: what rigkit ships to every Linux rig and what both sides must agree on.

Python 3.9+ standard library only; nothing here imports the rest of rigkit, so the package runs
as it is on a rig (installed at names.RUNTIME_DIR, imported by the rig-side scripts) and every
control-side package may import it.

- names.py: every path, unit name, project, volume and served-name rule both sides use (the one
  home of these literals; tests/test_layout.py checks that nothing else retypes them);
- stack.py: rigkit-stack's contract: its stack files, each verb's command line (built by the roles,
  parsed by the program), its exit codes (the one home of these; a layout test checks that too);
- keyfile.py: reading a key from an env file as Compose reads it (raw: the rest of the line);
- probe.py: a real completion with a deadline (the one-token readiness probe);
- lock.py: a stack's rollout lock (one folder, one rule);
- atomic.py: replacing a file atomically, on disk before it takes the old one's place;
- sampler.py: the shell commands that start and stop the NVML sampler on the rig (verify, tune).

roles/rigside.py installs it; rigkit-stack, rigkit-watchdog, rigkit-gateway and the status probe
import it from names.RUNTIME_DIR (`sys.path` gets names.LIB_DIR, or RIGKIT_LIB_DIR where set).
"""
