"""The cluster-wide reboot lock: one ``Lock`` protocol, etcd and FleetLock implementations."""
