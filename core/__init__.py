"""What every package stands on and no command: configuration (the only reader of the
environment), the error classes, database access, migrations, canonical JSON, durations, the
Procfile's processes, the embedded servers and a terminal progress line. The command line is
``cli``."""
