"""The lhc-ina controller: P4Runtime client, job store and the job service workers join."""
