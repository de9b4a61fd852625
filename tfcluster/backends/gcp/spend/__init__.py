"""What a cluster spends and may still spend: ledger_events (the cost ledger's events read from Compute
Engine: starts, stops, preemptions, deletions, storage; SpendTracker) and budget (`up --budget` as each
VM's hypervisor deadline; the rate `train --budget` is held to; Budget). GcpBackend holds one of each.

May import: the cloud, prices, zones and vms rooms, tfcluster.ledger and the bottom layer. Outside
tfcluster/backends/gcp/, only what __all__ names.
"""
