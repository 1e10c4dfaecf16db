"""``kured doctor``: checks for the failures that leave a cluster looking healthy while nothing
ever reboots, or while the wrong thing reboots (issue 15, deliverable 4). One module per group
of checks; ``kured.doctor.command`` is the command line and runs them in order."""
