"""Pipeline frequency planning (Perseus-style): profiles, the pipeline DAG and the time-energy frontier."""
