"""rigkit: provision, re-apply and verify local LLM inference rigs with pyinfra.

One package per feature, named like its role (roles/<name>.py) and its template
folder (templates/<name>/): `config` (what a rig file may say, the only reader of
pyinfra's host.data), `gpu`, `weights`, `serving`, `verify`, `windows`. Shared
helpers stay here: `render` (templates and shipped files), `sshforward`, `cli`.
"""
