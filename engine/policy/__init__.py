"""The scheduling policy, written once and executed twice: by the GPU engine (``engine.llm``) and by the cluster
simulator (``sim``). Torch-free; it imports neither the engine's runner nor the simulator.

- ``config``: ``PolicyConfig``, the single source of the policy's defaults; ``options`` turns config fields into
  command-line options.
- ``request``, ``sampling_params``: a request's life cycle and how it samples and stops.
- ``block_manager``: fixed-size KV blocks, their free queue, reference counts and prefix caching.
- ``plan``: ``BatchPlan`` (one forward pass as plain data), ``plan_features`` (what its cost depends on) and
  ``DecodeAhead`` (a decode pass enqueued before the tokens of the one it follows are known).
- ``scheduler``: the batch schedulers (SplitFuse, prefill-first, decode-first), which own their block manager.
- ``load_balancer``: which replica gets the next request (the simulator's cluster and the server's router).
"""

from engine.policy.block_manager import BlockManager
from engine.policy.config import PolicyConfig
from engine.policy.load_balancer import BALANCERS, LoadBalancer, ReplicaLoad, estimate_kv_usage, make_balancer
from engine.policy.plan import BatchPlan, DecodeAhead, PassFeatures, plan_features
from engine.policy.request import Request, RequestState
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import SCHEDULERS, Scheduler, SchedulerStats, make_scheduler, scheduler_class

__all__ = ["BALANCERS", "BatchPlan", "BlockManager", "DecodeAhead", "LoadBalancer", "PassFeatures", "PolicyConfig",
           "ReplicaLoad", "Request", "RequestState", "SCHEDULERS", "SamplingParams", "Scheduler", "SchedulerStats",
           "estimate_kv_usage", "make_balancer", "make_scheduler", "plan_features", "scheduler_class"]
