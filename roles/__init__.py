"""rigkit's roles: one pyinfra @deploy function per role, its defaults beside it."""
