"""The rig side: what rigkit ships to every Linux rig and what both sides must agree on.

Python 3.9+ standard library only; nothing here imports the rest of rigkit, so the package runs
as it is on a rig (installed at names.RUNTIME_DIR, imported by the rig-side scripts) and every
control-side package may import it.

- names.py: every path, unit name, project, volume and served-name rule both sides use (the one
  home of these literals; tests/test_layout.py checks that nothing else retypes them).
"""
