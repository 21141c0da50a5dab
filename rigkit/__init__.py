"""rigkit: provision, re-apply and verify local LLM inference rigs with pyinfra.

One package per feature, named like its role (roles/<name>.py) and its template folder
(templates/<name>/): `preflight`, `base`, `gpu`, `weights`, `serving`, `verify`, `gateway`,
`windows` (Windows only); the commands `status` and `tune`. Beneath them: `config` (what a rig
file may say; the only reader of pyinfra's host.data) and `rigside` (the runtime shipped to every
Linux rig, and the one home of the names and paths both sides use) and `plumbing` (templates and
shipped files, file and unit states read in one command, facts read once, SSH and port forwards,
a faster pyinfra start). Only `cli` (the `rigkit` command: parsing and dispatch) sits here.
docs/architecture.md shows what flows where.
"""
