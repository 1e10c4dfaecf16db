"""Demonstrations that run the whole system on one machine (``kura demo ...``).

``kura.demo.rolling``: a rolling reboot of a live kura mesh coordinated by kured agents, with
real load and real build tools throughout. The same code runs the user command and the e2e test
(tests/e2e/test_rolling_reboot.py). kured, etcd and Prometheus run as subprocesses: nothing here
imports ``kured``.
"""
