"""splitfuse engine: the torch-free policy layer (requests, KV block manager, schedulers, load balancing)
and, imported lazily so that ``import engine`` never pulls in torch, the model runner and the ``LLM`` pipeline.
"""

from engine.block_manager import BlockManager
from engine.request import Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import SCHEDULERS, BatchPlan, make_scheduler

_LAZY = {"LLM": "engine.llm", "LLMEngine": "engine.llm", "RequestOutput": "engine.llm"}

__all__ = ["BatchPlan", "BlockManager", "Request", "RequestState", "SamplingParams", "SCHEDULERS",
           "make_scheduler", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
