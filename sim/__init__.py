"""The cluster simulator: SimPy replicas that run the engine's own scheduler (``engine.policy``), advancing
simulated time by a calibrated cost model of each ``BatchPlan``.

- ``workload``: request lengths, Poisson/gamma/closed-loop arrivals, trace replay (CSV/JSONL, other tools' column
  names); ``Workload``'s defaults are the command's.
- ``saturation``: the cluster's estimated saturation rate, and the rate a run without one goes at.
- ``costs``: ``CostModel`` (what a replica needs from a cost model), loading a shipped profile
  (``calibration.profile``), ``SlowerHost`` (a cost model on a host whose passes run longer), plus
  constant/linear cost models for tests.
- ``replica``: one replica as a SimPy process (schedule -> wait the plan's cost -> update).
- ``cluster``: ``ClusterConfig`` (replicas, a ``PolicyConfig``, cost models) and ``simulate``, one replication:
  N replicas behind a load balancer (``engine.policy.load_balancer``); with a state-free balancer, big runs spread
  the replicas over worker processes, with identical results.
- ``request_log``, ``token_stats``: per-request aggregates and streaming inter-token statistics (FastGen's
  EWM and cumulative SLA statistics, a log-spaced gap histogram), so memory stays bounded on long runs.
- ``metrics``: percentiles, throughput, FastGen effective throughput, goodput, steady-state rates, energy
  (joules per request, fleet power, kWh, where the profile has an energy section), confidence intervals, the
  summary table, and ``requests.csv`` (``audit_frame``); ``units``: each summary key's meaning, unit and printed
  form.
- ``steady_state``: the warm-up rule (MSER-5), batch means and the queue's growth over a run.
- ``capacity``: replications over seeds, load sweeps, the steady-state capacity search (run lengths grown until
  its intervals decide, never a rate whose queue grows) and paired comparisons of configurations.
- ``parallel``: ``run_map``, where independent runs go (local processes or Ray), with the same results either way;
  ``parallel_options``: the --backend, --processes and --ray-address flags.
- ``plan``: the cheapest fleet meeting an SLA at a target rate (priced in ``calibration/prices.csv``), with
  ``plan_cli`` (``splitfuse plan``) and ``plan_report`` (``plan.html``).
- ``scaling``: the replica scaling study's ratios, linearity rule and figure.
- ``run_config``: what a run was (profile, card, policy, workload, seeds, SLA, commit).
- ``report``, ``report_figures``: ``report.html``; ``cli``: ``splitfuse simulate``.
- ``validation_example``: the example validation grid (the simulator against itself, not a GPU measurement).
- ``loop_phases``: the engine loop between passes, phase by phase, from ``splitfuse validate`` runs' pass traces
  (``python -m sim.loop_phases RUN...``).
- ``bench``: the client that measures a real server and summarizes it as the simulator summarizes its own runs;
  ``bench_cli``: ``splitfuse bench`` in ``vllm bench serve``'s flags; ``bench_result``: vLLM's JSON result.

Importing ``sim`` never imports torch.
"""
