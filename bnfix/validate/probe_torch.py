"""The PyTorch probe: global module hooks (the script's modules are not touched) that record what
each BatchNorm call does to its running statistics, snapshots of every BN after each optimizer
step, and the order of the SyncBN conversion, the DDP wrap and the optimizer."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from bnfix.validate.probe_runtime import ProbeLog, values

BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
            "running_var": "moving_variance"}


@dataclass
class _Calls:
    """Counters of one kind of BN call (layer, mode, grad, frozen, input from a biased layer)."""

    calls: int = 0
    moved_max: float = 0.0
    moved_sum: float = 0.0
    written_at: int = 0


@dataclass
class TorchProbe:
    torch: ModuleType
    log: ProbeLog
    names: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    frozen: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # BN put in eval directly
    wrapped: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # modules inside a DDP
    optimizers: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    roots: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    calls: dict[tuple, _Calls] = field(default_factory=dict)
    depth: int = 0
    train_depth: int = 0
    steps: int = 0
    started: bool = False
    pending: list[tuple[Any, Any]] = field(default_factory=list)  # (bn, running_mean before)
    last_output: tuple[Any, bool] | None = None  # (weakref to a conv/linear output, has bias)

    # -- module calls ------------------------------------------------------------------------
    def pre(self, module: Any, args: tuple) -> None:
        if self.depth == 0 and module not in self.roots:
            self.roots.add(module)
            self._name_all()
        self.depth += 1
        if self._is_bn(module):
            if module not in self.names:  # built or swapped in after its model's first call
                self._name_all()
            mean = module.running_mean
            self.pending.append((module, None if mean is None else mean.detach().clone()))

    def _name_all(self) -> None:
        for root in list(self.roots):
            for name, sub in root.named_modules():
                if self._is_bn(sub):
                    self.names.setdefault(sub, _strip(name) or type(sub).__name__)

    def post(self, module: Any, args: tuple, output: Any) -> None:
        self.depth = max(self.depth - 1, 0)
        torch = self.torch
        if self._is_bn(module):
            self._bn_done(module, args)
        elif isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) and \
                isinstance(output, torch.Tensor):
            self.last_output = (weakref.ref(output), module.bias is not None)

    def _bn_done(self, module: Any, args: tuple) -> None:
        before = None
        while self.pending:
            bn, mean = self.pending.pop()
            if bn is module:
                before = mean
                break
        moved = 0.0
        if before is not None and module.running_mean is not None:
            moved = float((module.running_mean.detach() - before).abs().max())
        source = self.last_output
        biased = bool(source and args and source[0]() is args[0] and source[1])
        weight = module.weight
        frozen = (weight is not None and not weight.requires_grad) or module in self.frozen
        grad = self.torch.is_grad_enabled() and not self.torch.is_inference_mode_enabled()
        key = (self.names.get(module, type(module).__name__), type(module).__name__,
               bool(module.training), grad, frozen, biased)
        counter = self.calls.setdefault(key, _Calls())
        counter.calls += 1
        counter.moved_sum += moved
        grew = moved > counter.moved_max
        counter.moved_max = max(counter.moved_max, moved)
        # cumulative counters, rewritten when they change shape: few lines, robust to os._exit
        if grew or counter.calls >= 2 * counter.written_at or counter.calls == 1:
            counter.written_at = counter.calls
            self.log.write("bn_calls", layer=key[0], cls=key[1], training=key[2], grad=key[3],
                           frozen=key[4], biased_input=key[5], calls=counter.calls,
                           moved_max=counter.moved_max, moved_sum=counter.moved_sum)

    def _is_bn(self, module: Any) -> bool:
        return isinstance(module, self.torch.nn.modules.batchnorm._BatchNorm)

    # -- steps, conversions, wraps -----------------------------------------------------------
    def initial(self) -> None:
        """Step 0: the BN state before the first optimizer step."""
        if self.steps == 0 and not self.started:
            self.started = True
            self._snapshot(0)

    def step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.steps <= self.log.max_steps:
            self._snapshot(self.steps)
        if self.steps == 1:
            self.log.write("files", files=self.log.project_files())

    def _snapshot(self, step: int) -> None:
        layers = {}
        for bn, name in list(self.names.items()):
            state = {}
            for attr, tf_name in BN_NAMES.items():
                tensor = getattr(bn, attr, None)
                if tensor is not None:
                    state[tf_name] = values(tensor.detach().float().cpu())
            layers[name] = state
        self.log.write("step", step=step, layers=layers)

    def wrap(self, module: Any) -> None:
        bns = [m for m in module.modules() if self._is_bn(m)]
        sync = [m for m in bns if isinstance(m, self.torch.nn.SyncBatchNorm)
                or "Sync" in type(m).__name__]
        self.wrapped.update(module.modules())
        self.log.write("wrap", plain_bn=len(bns) - len(sync), sync_bn=len(sync))

    def convert(self, module: Any) -> None:
        ddp = self.torch.nn.parallel.DistributedDataParallel
        params = {id(p) for p in module.parameters()}
        after_optimizer = any(id(p) in params for opt in list(self.optimizers)
                              for group in opt.param_groups for p in group["params"])
        self.log.write("convert", after_wrap=isinstance(module, ddp) or module in self.wrapped,
                       after_optimizer=after_optimizer)


def _strip(name: str) -> str:
    """`module.0.1` (inside DDP/DataParallel) names the same layer as `0.1`."""
    return name.removeprefix("module.")


def install(torch: ModuleType, log: ProbeLog) -> None:
    """Register the global hooks and wrap the three calls whose order BN103 is about."""
    import importlib

    probe = TorchProbe(torch, log)
    optim = importlib.import_module("torch.optim.optimizer")  # torch may load it lazily
    parallel = importlib.import_module("torch.nn.parallel")
    hooks = torch.nn.modules.module
    hooks.register_module_forward_pre_hook(lambda m, a: log.guard("torch pre",
                                                                  lambda: probe.pre(m, a)))
    hooks.register_module_forward_hook(lambda m, a, o: log.guard("torch post",
                                                                 lambda: probe.post(m, a, o)),
                                       always_call=True)
    optim.register_optimizer_step_pre_hook(
        lambda o, a, k: log.guard("torch step", lambda: probe.initial()))
    optim.register_optimizer_step_post_hook(
        lambda o, a, k: log.guard("torch step", lambda: probe.step(o, a, k)))
    log.rank = _rank_getter(torch, log.rank)

    module_train = torch.nn.Module.train

    def train(self: Any, mode: bool = True) -> Any:
        if probe.train_depth == 0 and not mode and probe._is_bn(self):
            probe.frozen.add(self)
        probe.train_depth += 1
        try:
            return module_train(self, mode)
        finally:
            probe.train_depth -= 1

    torch.nn.Module.train = train

    optimizer_init = optim.Optimizer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, *args, **kwargs)
        probe.optimizers.add(self)

    optim.Optimizer.__init__ = init

    ddp = parallel.DistributedDataParallel
    ddp_init = ddp.__init__

    def ddp_wrap(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        log.guard("torch wrap", lambda: probe.wrap(module))
        ddp_init(self, module, *args, **kwargs)

    ddp.__init__ = ddp_wrap

    sync = torch.nn.SyncBatchNorm
    converter = sync.__dict__["convert_sync_batchnorm"].__func__

    def convert_sync_batchnorm(cls: type, module: Any, *args: Any, **kwargs: Any) -> Any:
        log.guard("torch convert", lambda: probe.convert(module))
        return converter(cls, module, *args, **kwargs)

    sync.convert_sync_batchnorm = classmethod(convert_sync_batchnorm)


def _rank_getter(torch: ModuleType, fallback: Any) -> Any:
    def rank() -> int | None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
        return fallback()
    return rank
