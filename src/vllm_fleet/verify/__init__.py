"""Post-deploy verification of a fleet: smoke, cross-talk under load, prefix-cache probes."""
