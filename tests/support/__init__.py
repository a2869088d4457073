"""What the tests share: arenas and gateways, process fleets, clusters, browsers, faults."""
