"""splitfuse engine: Hugging Face decoder models served with a paged KV cache and the shared scheduling policy
(``engine.policy``, torch-free). The model runner and the ``LLM`` pipeline are imported lazily, so that
``import engine`` never pulls in torch.
"""

from engine.policy import SamplingParams

_LAZY = {"LLM": "engine.llm", "LLMEngine": "engine.llm", "RequestOutput": "engine.outputs",
         "CompletionOutput": "engine.outputs", "RequestMetrics": "engine.outputs", "EngineConfig": "engine.config"}

__all__ = ["SamplingParams", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
