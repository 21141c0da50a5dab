"""A pyinfra deploy file for tests/test_pyinfra_start.py: one operation that takes a while."""

from pyinfra.operations import server

server.shell(name="rigkit-test: sleep", commands=["sleep 3"])
