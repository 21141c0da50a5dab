"""Windows rigs (role windows, templates/windows/): the `@winssh` pyinfra connector, facts
and operations in PowerShell, the scheduled-task bundle, and Windows' own policy rules.
Nothing outside this package and roles/windows.py imports it (tests/test_layout.py)."""
