"""Configuration, errors, database access, migrations and the command line."""
