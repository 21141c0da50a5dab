"""Windows rigs (role windows, templates/windows/): the `@winssh` pyinfra connector, facts
and operations in PowerShell, the scheduled-task bundle, and Windows' own policy rules; what the
`rigkit` command does for Windows rigs (commands). Nothing outside this package, roles/windows.py
and the command line's front door imports it (tests/test_layout.py)."""
