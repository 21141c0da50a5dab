"""Fleet status (`rigkit status`, status.py): read each rig's state without changing it, compare it
with the inventory, and call out every difference as drift with the command that repairs it.

- facts.py: the read-only probe (templates/status/rigkit-status-probe.py) as a pyinfra fact;
- collect.py: what status.py runs per rig (inside one python.call, so pyinfra fans out to all
  rigs in parallel) and where it leaves each rig's document;
- report.py: pure: facts + config -> the rig's document, its drift and failures;
- table.py: pure: the document as a table for a person;
- fleet.py: the command on the control machine: status.py on every rig at once under one deadline,
  the documents gathered, the tables, the summary and the JSON.
"""
