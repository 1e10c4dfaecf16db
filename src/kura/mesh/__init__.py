"""The peer mesh: discovery, the replication outbox and shipper, bootstrap from peers."""
