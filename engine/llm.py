"""The engine loop and the pipeline API.

``LLMEngine`` is persistent (add requests any time, call ``step`` for one forward pass; the server drives it);
``LLM`` is the non-persistent pipeline of DeepSpeed-FastGen's ``mii.pipeline``: ``generate`` runs a list of
prompts to completion and returns one output per prompt, in order.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.cuda_graphs import MAX_GRAPH_TOKENS
from engine.detokenize import Detokenizer
from engine.memory import num_kv_blocks_for
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.policy import (
    BatchPlan,
    DecodeAhead,
    PassFeatures,
    Request,
    SamplingParams,
    SchedulerStats,
    make_scheduler,
    plan_features,
)
from engine.prompts import check_prompt, split_prompt
from engine.runner import LaunchedPass, ModelRunner
from engine.weights import load_model

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

Prompt = str | list[int] | dict  # text, token ids, {"prompt": text} or {"prompt_token_ids": ids}
# what ``LLMEngine.step_deltas`` returns per request: (request_id, new token ids, finished, finish_reason, seconds
# from arrival to first scheduled); a plain tuple, cheap to build and to pickle
Delta = tuple[str, list[int], bool, str | None, float | None]


@dataclass(slots=True)
class _Entry:
    """A request the engine serves: its scheduler state, its prompt's text, and the detokenizer that watches its
    text for stop strings (when it has any)."""

    request: Request
    prompt: str | None
    detokenizer: Detokenizer | None


@dataclass(slots=True)
class PassRecord:
    """One engine step as it ran (``time.perf_counter`` seconds): entered, plan made, pass enqueued (inputs
    copied, graph replayed or kernels launched), sampled ids on the host (the one sync), applied by the scheduler,
    outputs built. ``path``: "decode-graph", "mixed-graph" or "eager"; ``ahead``: the pass was enqueued during the
    step before; ``discarded``: this step discarded the pass enqueued during the step before (its plan was another),
    which the GPU runs first. A profile's pass (``calibration.sweep``) spans ``start`` to ``updated``. ``device_s``: the
    pass's device seconds (``LaunchedPass.device_s``) when traced with ``device_time`` on CUDA, else None."""

    start: float
    scheduled: float
    launched: float
    sampled: float
    updated: float
    end: float
    features: PassFeatures
    path: str
    ahead: bool
    num_outputs: int
    device_s: float | None = None
    discarded: bool = False


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _configure_logging() -> None:
    """Start-up facts (KV cache size) go to stderr at INFO unless the application configured the logger."""
    logger = logging.getLogger("splitfuse")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("splitfuse %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


class LLMEngine:
    """Scheduler + model runner behind ``add_request`` / ``step`` / ``abort``, built from an ``EngineConfig`` (or
    from a model and the config's fields as keyword arguments: ``LLMEngine("tiny-llama", device="cpu")``).

    On CUDA the KV cache takes ``gpu_memory_utilization`` of the card minus the weights and the activation peak
    of a pass of ``max_num_batched_tokens`` tokens and of the largest pass graph (unless ``num_kv_blocks`` is
    given), and decode-only passes and passes of up to ``MAX_GRAPH_TOKENS`` tokens replay CUDA graphs
    (``enforce_eager=True`` turns them off).

    ``pipeline_decodes``: after enqueuing a greedy decode-graph pass, the engine also enqueues the pass that follows
    it if nothing changes (``Scheduler.next_decode_plan``: every request one token further, input ids taken on the
    device from this pass's argmax) before it waits for this one, so the GPU does not idle while the host updates,
    schedules and packs. The next ``step`` schedules as always and uses that pass only if its plan is the same or a
    subset (requests that finished or were aborted drop out; their rows are ignored); otherwise the pass is
    discarded. Plans are those of the engine without it. Physical KV blocks can differ: a request that starts a new
    block with its next token gets it one step early, and if it then stops on a token, the block returns to the
    free list's tail.
    """

    def __init__(self, model: str | EngineConfig, **kwargs):
        _configure_logging()
        if isinstance(model, EngineConfig):
            if kwargs:
                raise TypeError("pass an EngineConfig or a model with keyword arguments, not both")
            config = model
        else:
            config = EngineConfig.from_kwargs(model, **kwargs)
        self.config = config
        policy = config.policy
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        torch.manual_seed(config.seed)
        self.model, self.model_config, self.tokenizer = load_model(config.model, self.dtype, self.device, config.seed)
        if hasattr(self.model, "merge_projections"):
            self.model.merge_projections()
        model_config = self.model_config
        self.max_model_len = min(model_config.max_model_len, config.max_model_len or model_config.max_model_len)
        use_graphs = self.device.type == "cuda" and not config.enforce_eager
        graph_tokens = min(MAX_GRAPH_TOKENS, policy.max_num_batched_tokens, self.max_model_len) if use_graphs else 0
        num_kv_blocks = config.num_kv_blocks
        if num_kv_blocks is None:
            num_kv_blocks = num_kv_blocks_for(model_config, policy.block_size, self.dtype, self.device,
                                              policy.max_num_seqs, self.max_model_len, config.gpu_memory_utilization,
                                              self.model, policy.max_num_batched_tokens, graph_tokens)
        self.scheduler = make_scheduler(policy, num_kv_blocks, self.max_model_len)
        self.runner = ModelRunner(self.model, model_config, num_kv_blocks, policy.block_size, self.device, self.dtype,
                                  config.seed, max_model_len=self.max_model_len,
                                  max_graph_batch=min(policy.max_num_seqs, policy.max_num_batched_tokens),
                                  max_graph_tokens=graph_tokens, use_cuda_graphs=use_graphs)
        self.eos_token_id = model_config.eos_token_id
        self.extra_eos_token_ids = model_config.eos_token_ids[1:]  # e.g. Llama-3 instruct's <|eot_id|>
        self._requests: dict[str, _Entry] = {}
        self._next_id = itertools.count()
        self.pipeline_decodes = config.pipeline_decodes
        self._ahead: tuple[DecodeAhead, LaunchedPass] | None = None  # the pass enqueued ahead
        self.pipeline_stats = {"enqueued": 0, "used": 0, "discarded": 0}
        self._pass_observers: list[tuple[Callable[[PassRecord], None], bool]] = []
        self._timed = False  # an observer asked for device time
        self._closed = False

    @property
    def block_size(self) -> int:
        return self.config.policy.block_size

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    def stats(self) -> SchedulerStats:
        """Running and waiting requests, preemptions, passes and KV blocks, from the scheduler."""
        return self.scheduler.stats()

    def trace_passes(self, callback: Callable[[PassRecord], None], device_time: bool = False) -> Callable[[], None]:
        """Call ``callback`` with a ``PassRecord`` of every step that ran a pass (a pass-level trace; timing
        benchmarks read it instead of wrapping the engine's parts); returns a function that ends this trace.
        ``device_time``: fill the records' ``device_s`` (on CUDA: two events around each launch, passes enqueued
        ahead too, and a wait for the pass's end event after its result)."""
        entry = (callback, device_time)
        self._pass_observers.append(entry)
        self._timed = any(timed for _, timed in self._pass_observers)

        def untrace() -> None:
            self._pass_observers = [e for e in self._pass_observers if e is not entry]
            self._timed = any(timed for _, timed in self._pass_observers)

        return untrace

    def set_max_num_seqs(self, max_num_seqs: int) -> None:
        """Admit at most ``max_num_seqs`` running requests from now on (the scheduler's bound). ValueError unless
        it is an integer from 1 to the ``max_num_seqs`` the engine was built with (its CUDA graphs and KV cache
        were sized for that many)."""
        built = self.config.policy.max_num_seqs
        if not isinstance(max_num_seqs, int) or isinstance(max_num_seqs, bool) or not 1 <= max_num_seqs <= built:
            raise ValueError(f"max_num_seqs must be an integer from 1 to {built} (the engine's max_num_seqs), got "
                             f"{max_num_seqs!r}")
        self.scheduler.max_num_seqs = max_num_seqs

    def close(self) -> None:
        """Release the model, its KV cache and its CUDA graphs (their GPU memory returns to torch's allocator, and
        to the card after ``torch.cuda.empty_cache()`` once nothing else holds it). ``step`` then raises
        RuntimeError."""
        self._closed = True
        self._ahead = None
        self.runner.close()
        self.model = None

    # -- requests in -------------------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt; ValueError naming the problem for an empty, untokenizable or invalid one."""
        return check_prompt(split_prompt(prompt)[1], self.tokenizer, self.model_config.vocab_size)

    def new_request_id(self) -> str:
        """A request id no other request of this engine gets from it (``add_request`` uses it when given none)."""
        return str(next(self._next_id))

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams | dict | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request; returns its id. Raises ValueError (clear message) for input that can never run, and for
        ``n`` > 1, which ``LLM.generate`` serves (as ``n`` requests)."""
        params = self._check_params(sampling_params)
        if params.n != 1:
            raise ValueError(f"n={params.n}: LLMEngine.add_request runs one sample per request; LLM.generate serves "
                             f"n > 1 (as n requests), or add n requests with their own seeds")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer and the model has none; use stop_token_ids")
        text, ids = split_prompt(prompt)
        token_ids = check_prompt(ids, self.tokenizer, self.model_config.vocab_size)
        request_id = self.new_request_id() if request_id is None else str(request_id)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, token_ids, params,
                          time.monotonic() if arrival_time is None else arrival_time,
                          eos_token_id=self.eos_token_id, max_model_len=self.max_model_len)
        self.scheduler.add(request)
        detokenizer = Detokenizer(self.tokenizer, params.stop) if params.stop else None
        self._requests[request_id] = _Entry(request, text, detokenizer)
        return request_id

    def _check_params(self, params: SamplingParams | dict | None) -> SamplingParams:
        """A validated private copy (dataclasses.replace re-runs the checks, also after outside mutation)."""
        if params is None:
            params = SamplingParams()
        elif isinstance(params, dict):
            params = SamplingParams(**params)
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams or a dict, got {type(params).__name__}")
        else:
            params = dataclasses.replace(params)
        if self.extra_eos_token_ids and not params.ignore_eos:
            params.stop_token_ids = params.stop_token_ids + [
                t for t in self.extra_eos_token_ids if t not in params.stop_token_ids]
        return params

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; returns False if it is unknown or already finished."""
        if self._requests.pop(str(request_id), None) is None:
            return False
        self.scheduler.abort(str(request_id))
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one forward pass --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and run one pass; returns an output for every request that got a token or finished."""
        return self._step(self._output)

    def step_deltas(self) -> list[Delta]:
        """``step`` for a server that streams: one ``Delta`` per request that got a token or finished, and no
        ``RequestOutput`` (no copy of a request's tokens, no text), as vLLM v1's engine core hands its front end
        plain per-request deltas."""
        return self._step(self._delta)

    def _step(self, make: Callable[[_Entry], object]) -> list:
        if self._closed:
            raise RuntimeError("this LLMEngine is closed (close() released its model and KV cache); make a new one")
        start = time.perf_counter()
        plan = self.scheduler.schedule(time.monotonic())
        launched, discarded = self._take_ahead(plan)
        if plan is None:
            return []
        scheduled = time.perf_counter()
        ahead = launched is not None
        if launched is None:
            launched = self.runner.launch(plan, timed=self._timed)
        enqueued = time.perf_counter()
        if self.pipeline_decodes:
            self._enqueue_ahead(plan, launched)
        sampled = launched.result()
        sampled_at = time.perf_counter()
        finished = self.scheduler.update(plan, sampled, time.monotonic())
        updated = time.perf_counter()
        outputs = [make(entry) for entry in self._sampled_entries(plan, finished)]
        if self._pass_observers:
            record = PassRecord(start, scheduled, enqueued, sampled_at, updated, time.perf_counter(),
                                plan_features(plan), self.runner.path(plan), ahead, len(outputs),
                                launched.device_s() if self._timed else None, discarded)
            for callback, _ in self._pass_observers:
                callback(record)
        return outputs

    def _sampled_entries(self, plan: BatchPlan, finished: list[Request]) -> list[_Entry]:
        """Every request of ``plan`` that sampled a token, and every one that finished (by the scheduler, or here when
        its text reached a stop string); a finished one is no longer the engine's after this."""
        entries = []
        finished = list(finished)
        requests = self._requests
        for request, samples in zip(plan.requests, plan.samples):
            entry = requests.get(request.request_id)
            if samples and entry is not None and not request.is_finished:
                if entry.detokenizer is not None and self._reached_stop_string(entry):
                    finished.append(request)
                else:
                    entries.append(entry)
        for request in finished:
            entry = requests.pop(request.request_id, None)
            if entry is not None:
                entries.append(entry)
        return entries

    def _reached_stop_string(self, entry: _Entry) -> bool:
        """Feed the request's new token to its detokenizer; if its text now holds a stop string, finish it ("stop")."""
        request = entry.request
        entry.detokenizer.add(request.output_token_ids[-1:])
        if entry.detokenizer.stopped:
            self.scheduler.abort(request.request_id, reason="stop", now=request.last_token_time)
        return entry.detokenizer.stopped

    def _enqueue_ahead(self, plan: BatchPlan, launched: LaunchedPass) -> None:
        """Enqueue the decode pass that follows ``plan`` if nothing changes (see the class docstring), when this
        pass's tokens are greedy ids still on the device and the scheduler can tell that pass now."""
        if launched.greedy is None:
            return
        ahead = self.scheduler.next_decode_plan(plan)
        if ahead is None:
            return
        self._ahead = (DecodeAhead.of(ahead, self.block_size),
                       self.runner.launch(ahead, ids_from=launched.greedy, timed=self._timed))
        self.pipeline_stats["enqueued"] += 1

    def _take_ahead(self, plan: BatchPlan | None) -> tuple[LaunchedPass | None, bool]:
        """(The pass enqueued ahead, if ``plan`` is it or a subset of it (``DecodeAhead.rows_for``), else None;
        whether there was one and it is discarded: it wrote only slots its requests own)."""
        if self._ahead is None:
            return None, False
        ahead, launched = self._ahead
        self._ahead = None
        rows = ahead.rows_for(plan, self.block_size)
        if rows is None:
            self.pipeline_stats["discarded"] += 1
            return None, True
        self.pipeline_stats["used"] += 1
        if len(rows) == ahead.plan.num_seqs:
            return launched, False

        def subset() -> list[int]:
            ids = launched.result()
            return [ids[i] for i in rows]

        return LaunchedPass(subset, events=launched.events), False

    @staticmethod
    def _delta(entry: _Entry) -> Delta:
        request = entry.request
        queued = None if request.scheduled_time is None else request.scheduled_time - request.arrival_time
        return (request.request_id, request.output_token_ids[-1:], request.is_finished, request.finish_reason, queued)

    def _output(self, entry: _Entry) -> RequestOutput:
        """The request after a pass in which it sampled exactly one new token."""
        request, detokenizer = entry.request, entry.detokenizer
        finished = request.is_finished
        output_ids = list(request.output_token_ids)
        text, reason, stop_reason = None, request.finish_reason, None
        if finished and detokenizer is not None:
            if not detokenizer.stopped:
                detokenizer.add(output_ids[-1:], final=True)
            text = detokenizer.text
            if detokenizer.stopped:
                reason, stop_reason = "stop", detokenizer.stop_reason
        elif finished and self.tokenizer is not None:
            text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        if reason == "stop" and stop_reason is None and output_ids and output_ids[-1] != self.eos_token_id \
                and output_ids[-1] in request.sampling_params.stop_token_ids:
            stop_reason = output_ids[-1]
        metrics = RequestMetrics(request.arrival_time, request.scheduled_time, request.first_token_time,
                                 request.finish_time, request.num_preemptions)
        completion = CompletionOutput(0, text, output_ids, finish_reason=reason, stop_reason=stop_reason)
        return RequestOutput(request.request_id, entry.prompt, request.prompt_token_ids, [completion], finished,
                             metrics, new_token_ids=output_ids[-1:])


class LLM:
    """Pipeline: ``LLM(model).generate(prompts, sampling_params)`` -> one ``RequestOutput`` per prompt, in order.

    ``model`` is a preset name (random weights, see ``engine.presets``), a local Hugging Face directory or an
    ``EngineConfig``; keyword arguments are the fields of ``EngineConfig`` and ``PolicyConfig``.
    """

    def __init__(self, model: str | EngineConfig, **kwargs):
        self.engine = LLMEngine(model, **kwargs)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | dict | list[SamplingParams | dict] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; one ``RequestOutput`` per prompt, in order, with ``n`` completions (``n``
        requests, copy ``i`` seeded with ``seed + i`` when a seed is set). Prompts are text, token ids,
        ``{"prompt": text}`` or ``{"prompt_token_ids": ids}``. A prompt that cannot run (empty, too long, invalid
        sampling values) gets an output with ``finish_reason="error"`` and the reason in ``error``; the others are
        unaffected."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            params = sampling_params
        else:
            params = [sampling_params] * len(prompts)

        outputs: list[RequestOutput | None] = [None] * len(prompts)
        samples: list[list[RequestOutput | None]] = [[] for _ in prompts]
        slot_of: dict[str, tuple[int, int]] = {}  # request id -> (prompt, sample)
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                ids = self._add(prompt, p)
            except (ValueError, TypeError) as e:
                text = prompt if isinstance(prompt, str) else None
                rejected = CompletionOutput(0, None, [], finish_reason="error")
                outputs[i] = RequestOutput(f"rejected-{i}", text, [], [rejected], finished=True, error=str(e))
                continue
            samples[i] = [None] * len(ids)
            slot_of.update({rid: (i, j) for j, rid in enumerate(ids)})
        progress = None
        if use_tqdm:
            from tqdm import tqdm
            progress = tqdm(total=sum(1 for o in outputs if o is None), desc="generate")
        while slot_of and self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished and out.request_id in slot_of:
                    i, j = slot_of.pop(out.request_id)
                    samples[i][j] = out
                    if all(samples[i]):
                        outputs[i] = merge_samples(samples[i])
                        if progress is not None:
                            progress.update(1)
        if progress is not None:
            progress.close()
        return outputs

    def _add(self, prompt: Prompt, params: SamplingParams | dict | None) -> list[str]:
        """Add the ``n`` requests of one prompt (aborting those added if one is refused); returns their ids."""
        params = SamplingParams(**params) if isinstance(params, dict) else params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams or a dict, got {type(params).__name__}")
        parent = self.engine.new_request_id()
        if params.n == 1:
            return [self.engine.add_request(prompt, params, parent)]
        ids = []
        try:
            for j in range(params.n):
                seed = None if params.seed is None else params.seed + j
                child = dataclasses.replace(params, n=1, seed=seed)
                ids.append(self.engine.add_request(prompt, child, f"{j}_{parent}"))
        except (ValueError, TypeError):
            for rid in ids:
                self.engine.abort(rid)
            raise
        return ids


def merge_samples(samples: list[RequestOutput]) -> RequestOutput:
    """One prompt's finished samples (requests ``j_<id>``) as one ``RequestOutput`` with ``n`` completions."""
    if len(samples) == 1:
        return samples[0]
    first = samples[0]
    completions = [dataclasses.replace(s.outputs[0], index=j) for j, s in enumerate(samples)]
    ms = [s.metrics for s in samples]
    metrics = RequestMetrics(first.metrics.arrival_time,
                             min((m.first_scheduled_time for m in ms if m.first_scheduled_time), default=None),
                             min((m.first_token_time for m in ms if m.first_token_time), default=None),
                             max((m.finish_time for m in ms if m.finish_time), default=None),
                             sum(m.num_preemptions for m in ms))
    return RequestOutput(first.request_id.partition("_")[2], first.prompt, first.prompt_token_ids, completions,
                         finished=True, metrics=metrics)
