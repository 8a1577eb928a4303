"""Launch-aware tuning: spend launches (minutes each on a real node) where the model and the
measurements so far say they pay, and trust only what was re-measured.

- ``sla_search``: inside one launch, find the highest concurrency that meets the SLA.
- ``screen``: the performance model, recalibrated on every measurement, proposes what to launch.
- ``strategy``: exploration rounds, then successive halving of finalists over fresh launches.
- ``gates``: losslessness, acceptance sanity and a soak before a winner is crowned.
"""
