"""The cluster simulator: SimPy replicas that run the engine's own scheduler (``engine.policy``), advancing
simulated time by a calibrated cost model of each ``BatchPlan``.

- ``workload``: request lengths, Poisson/gamma/closed-loop arrivals, trace replay (CSV/JSONL).
- ``costs``: ``CostModel`` (what a replica needs from a cost model), loading a shipped profile
  (``calibration.profile``), plus constant/linear cost models for tests.
- ``replica``: one replica as a SimPy process (schedule -> wait the plan's cost -> update).
- ``cluster``: ``ClusterConfig`` (replicas, a ``PolicyConfig``, cost models) and ``simulate``, one replication:
  N replicas behind a load balancer (``engine.policy.load_balancer``); with a state-free balancer, big runs spread
  the replicas over worker processes, with identical results.
- ``request_log``, ``token_stats``: per-request aggregates and streaming inter-token statistics (FastGen's
  EWM and cumulative SLA statistics, a log-spaced gap histogram), so memory stays bounded on long runs.
- ``metrics``: percentiles, throughput, FastGen effective throughput, goodput, confidence intervals.
- ``capacity``: replications over seeds, load sweeps and the capacity search.
- ``report``: ``report.html`` with plotly figures; ``cli``: ``splitfuse simulate``.
- ``bench``: ``splitfuse bench``, the client that measures a real server and summarizes it as the simulator
  summarizes its own runs.

Importing ``sim`` never imports torch.
"""
