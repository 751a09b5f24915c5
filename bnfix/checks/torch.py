"""PyTorch training-loop rules: evaluation without eval() (BN101), a BN freeze that train()
undoes (BN102), SyncBN converted after the wrap/optimizer (BN103), a bias right before BN
(BN104, Keras too), and BN parameters frozen while the running statistics still move (BN105)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator

from bnfix.checks import check
from bnfix.checks.keras import frozen_in_inference
from bnfix.checks.names import is_evaluation, telling_first
from bnfix.checks.tensorflow import inference_only
from bnfix.findings import (
    Applicability,
    DeleteRows,
    Edit,
    Fix,
    InsertRows,
    Span,
    TryFinally,
    shown_path,
)
from bnfix.ir import (
    BiasBeforeBN,
    Binding,
    BNSite,
    CallSite,
    Condition,
    Const,
    Finding,
    FreezeCall,
    FromParam,
    FunctionInfo,
    ModeCall,
    ModelCall,
    ModelStep,
    ModuleIR,
    ParamFreeze,
    Related,
    bindings,
    is_const,
)

UNSAFE = Applicability.UNSAFE
DISPLAY = Applicability.DISPLAY_ONLY


# ---------------------------------------------------------------------------------------------
# BN101 missing-eval-mode


EVALUATION_DATA = re.compile(r"(?<![a-z])(val|valid|validation|test|eval|evaluation)(?![a-z])",
                             re.IGNORECASE)


def _evaluation_calls(module: ModuleIR) -> dict[tuple[int, str], list[ModelCall]]:
    """Model calls in evaluation code, by (function, model): in a function named like
    evaluation (`validate`, `evaluate`, …), or inside `torch.no_grad()` / `inference_mode()`
    while iterating evaluation data (`val_loader`, `test_set`). A `no_grad` block alone is not
    evaluation: momentum encoders, EMA teachers and memory banks run models there on purpose
    in train mode."""
    groups: dict[tuple[int, str], list[ModelCall]] = defaultdict(list)
    for call in module.model_calls:
        if is_evaluation(call.function) or (
                call.region is not None and EVALUATION_DATA.search(call.iterates)):
            groups[(id(call.function), call.target)].append(call)
    return groups


@check("BN101")
def missing_eval_mode(module: ModuleIR) -> Iterator[Finding]:
    trained = {m.target for m in module.mode_calls if m.kind == "train"}
    evals = [m for m in module.mode_calls if m.kind == "eval"]
    for (_, target), calls in _evaluation_calls(module).items():
        first = min(calls, key=lambda c: c.span.start)
        function = first.function
        elsewhere = _trained_by_callers(module, function, target)
        if target not in trained and not elsewhere:
            continue
        if any(e.target == target and e.function is function and e.span.start < first.span.start
               for e in evals):
            continue
        region = first.region
        if any(m.kind == "train" and m.target == target and m.function is function and
               m.span.start < first.span.start and
               (region is None or region.kind == "function" or region.span.start <= m.span.start)
               for m in module.mode_calls):
            continue  # train mode set inside the evaluation code: on purpose (update_bn, ...)
        if region is not None and region.previous_row is not None and any(
                m.kind == "train" and m.target == target and m.function is function and
                m.statement.first_row == region.previous_row for m in module.mode_calls):
            continue  # `model.train()` right before the block: train mode chosen for it
        if function is not None and target in function.callers_eval and not elsewhere:
            continue
        where = f"`{function.name}`" if function is not None else "this evaluation code"
        if target in trained:
            trains = "elsewhere in this module"
        else:
            trains = f"by its caller {_site_place(elsewhere[0])}"
            if not elsewhere[0].where:
                trains += f" (`{getattr(elsewhere[0].args.get(target), 'text', target)}`)"
        message = (
            f"{where} runs `{target}` for evaluation without `{target}.eval()`, and `{target}` is "
            f"put in train mode {trains}: its BatchNorm layers normalize with the "
            "batch's statistics and keep updating their running averages during evaluation"
        )
        related = tuple(Related(s.where, s.span, f"passes a model it trains ({s.call.callee}"
                                                 "(...)) without putting it in eval mode first")
                        for s in elsewhere[:2] if s.where)
        yield Finding("BN101", first.span, message, _bn101_fix(module, first, target), related)


def _trained_by_callers(module: ModuleIR, function: FunctionInfo | None,
                        param: str) -> list[CallSite]:
    """Calls that pass, as `param`, a model their module puts in train mode without putting
    it in eval mode first: calls in other files (their facts say), and calls here."""
    if function is None or param not in function.params:
        return []
    trained = {m.target for m in module.mode_calls if m.kind == "train"}
    out = []
    for site in function.call_sites:
        value = site.args.get(param)
        text = getattr(value, "text", None) or getattr(value, "name", None)
        if not text:
            continue
        if site.where:
            if f"train:{text}" in site.facts and f"prepared:{text}" not in site.tags:
                out.append(site)
        elif text in trained and not any(
                m.kind == "eval" and m.target == text and m.function is site.caller
                and m.span.start < site.span.start for m in module.mode_calls):
            out.append(site)
    return out


def _site_place(site: CallSite) -> str:
    return f"in {shown_path(site.where)}:{site.span.start.row}" if site.where else \
        f"on line {site.span.start.row}"


def _bn101_fix(module: ModuleIR, call: ModelCall, target: str) -> Fix:
    """Guard the whole function when it is evaluation code (by name or decorator), else the
    `no_grad` block the model runs in."""
    function = call.function
    whole = function is not None and (is_evaluation(function) or (
        call.region is not None and call.region.kind == "function"))
    block = call.region.body if call.region is not None else None
    body = function.body if whole and function is not None else block
    bound = call.bound_row
    if body is not None and bound is not None and body.first_row <= bound:
        body = block if block is not None and block.first_row > bound else None  # after it
    if body is None:
        return Fix(DISPLAY, f"Call `{target}.eval()` before evaluating (and restore the mode)")
    saved = module.fresh_name("was_training")
    guard = TryFinally(body.first_row, body.last_row,
                       (f"{saved} = {target}.training", f"{target}.eval()"),
                       (f"{target}.train({saved})",))
    return Fix(UNSAFE, f"Evaluate in eval mode and restore `{target}`'s mode afterwards", (guard,))


# ---------------------------------------------------------------------------------------------
# BN102 train-undoes-bn-freeze

# `{target}.freeze_bn()`: a method of the model's own class (`apply(fn)` and `fn(model)` work
# on a wrapper too: they go through its submodules)
METHOD_FREEZE = re.compile(r"\{target\}\.(?!apply\()\w+\(\)")


def _base(target: str) -> str:
    """The model a DDP/DataParallel wrapper's `.module` is."""
    return target.removesuffix(".module")



@check("BN102")
def train_undoes_bn_freeze(module: ModuleIR) -> Iterator[Finding]:
    for shadow in module.shadowed_methods:
        message = (
            f"`self.{shadow.name} = ...` in class `{shadow.class_name}` hides its method "
            f"`{shadow.name}()` that freezes BatchNorm: `obj.{shadow.name}()` then calls the "
            "attribute (a TypeError for a bool) or `if obj.freeze…:` tests the method (always "
            "true), and the BN freeze silently never happens; rename the attribute"
        )
        yield Finding("BN102", shadow.span, message, Fix(DISPLAY, "Rename the attribute"))
    if module.freezing_trains:
        return  # a class re-applies its freeze in train(): the freeze survives train()
    freezes = defaultdict(list)
    for freeze in module.freeze_calls:  # `model.module.freeze_bn()` freezes what `model` wraps
        freezes[_base(freeze.target)].append(freeze)
    for mode in module.mode_calls:
        if mode.kind != "train" or not mode.used_after:
            continue  # the last word on a local or a parameter: nothing runs it here after
        applied = [f for f in freezes.get(_base(mode.target), ()) if _same_object(f, mode)]
        if not applied:
            continue
        if any(f.function is mode.function and f.span.start > mode.span.start for f in applied):
            continue  # re-frozen after this train()
        freeze = applied[0]
        where = freeze.origin or f"line {freeze.span.start.row}"
        message = (
            f"`{mode.target}.train()` puts every BatchNorm back in train mode, undoing the BN "
            f"freeze `{freeze.text.format(target=freeze.target)}` ({where}), "
            "which is not applied again afterwards: the frozen BNs' running statistics move "
            "again from here on"
        )
        yield Finding("BN102", mode.span, message,
                      _bn102_fix(mode, freeze, _wrapped(module, mode)))


def _same_object(freeze: FreezeCall, mode: ModeCall) -> bool:
    """Whether the freeze and the `train()` call name one object: the same local in one
    function, a module-level name, or one `self.` attribute in the methods of one class."""
    if freeze.function is mode.function or freeze.function is None:
        return True
    if not mode.target.startswith("self.") or mode.function is None:
        return False
    return freeze.function.class_name is not None and \
        freeze.function.class_name == mode.function.class_name


def _wrapped(module: ModuleIR, mode: ModeCall) -> bool | None:
    """Whether `mode`'s target holds a DDP/DataParallel wrapper there (the wrapper has none
    of the model's own methods): it was assigned one earlier in the same function, on every
    path (no `if` around the wrap, or a wrap in both branches of one); None when only some
    paths wrap it."""
    wraps = [s for s in module.model_steps
             if s.kind == "model_wrap" and s.assigned == mode.target and
             s.function is mode.function and s.statement.span.start < mode.span.start]
    if not wraps:
        return False
    tests = [s.conditions[0] for s in wraps if len(s.conditions) == 1]
    if any(not s.conditions for s in wraps) or any(a.excludes(b) for a in tests for b in tests):
        return True
    return None


def _bn102_fix(mode: ModeCall, freeze: FreezeCall, wrapped: bool | None) -> Fix:
    target = mode.target
    if wrapped is not False and METHOD_FREEZE.fullmatch(freeze.text):
        if wrapped is None:
            return Fix(DISPLAY, f"Apply the freeze again after `{mode.target}.train()`: "
                                f"`{freeze.text.format(target=target + '.module')}` where it is "
                                "wrapped in DDP/DataParallel, "
                                f"`{freeze.text.format(target=target)}` where it is not")
        target += ".module"  # a method of the model: reached through the wrapper's `.module`
    text = freeze.text.format(target=target)
    advice = Fix(DISPLAY, f"Apply the freeze again after `{mode.target}.train()`: `{text}`")
    if freeze.text.endswith(".train()"):  # inserting it would be the call it undoes: no end
        return Fix(DISPLAY, "Override `train()` in the model class to re-apply the BN freeze")
    if not freeze.reapplicable:
        return Fix(DISPLAY, f"Apply the freeze again after `{mode.target}.train()` when the model "
                            f"was built frozen (`{text}`, on `.module` of a DDP/DataParallel "
                            "wrapper), or override `train()` in the model class to re-apply it")
    statement = mode.statement
    if not statement.wrappable:
        return advice
    lines: tuple[tuple[int, str], ...] = ((0, text),)
    if freeze.condition is not None:
        same_class = freeze.function is not None and mode.function is not None and \
            freeze.function.class_name is not None and \
            freeze.function.class_name == mode.function.class_name
        if freeze.function is mode.function and freeze.span.start < mode.span.start:
            condition = freeze.condition
        elif same_class and freeze.condition_in_class is not None:
            condition = freeze.condition_in_class
        else:
            return advice
        lines = ((0, f"if {condition}:"), (1, text))
    insert = InsertRows(statement.last_row + 1, statement.indent, lines)
    return Fix(UNSAFE, f"Re-apply the BN freeze after `{mode.target}.train()`", (insert,))


# ---------------------------------------------------------------------------------------------
# BN103 sync-bn-after-wrap


@check("BN103")
def sync_bn_after_wrap(module: ModuleIR) -> Iterator[Finding]:
    for convert in (s for s in module.model_steps if s.kind == "sync_convert"):
        model = _base(convert.target)
        earlier = [
            s for s in module.model_steps
            if s.kind in ("model_wrap", "optimizer") and s.function is convert.function
            and s.statement.first_row < convert.statement.first_row
            and model in (s.target, s.assigned, _base(s.target))
            and not any(a.excludes(b) for a in s.conditions for b in convert.conditions)
        ]
        if not earlier:
            continue
        what = " and ".join(sorted({
            "after the model was wrapped for data parallelism" if s.kind == "model_wrap"
            else "after the optimizer was built from its parameters" for s in earlier}))
        inside = [s for s in (convert, *earlier) if s.through is not None]
        helpers = "".join(f" (`{s.call.callee}` does it in {s.through.describe()})"
                          for s in inside[:2] if s.through is not None)
        why = []
        if any(s.kind == "model_wrap" for s in earlier):
            why.append("the wrapper was built over the old modules")
        if any(s.kind == "optimizer" for s in earlier) and convert.fresh:
            why.append(f"`{convert.qualname}` gives the new BN layers new weight and bias "
                       "parameters, so the optimizer keeps updating the old ones: the BN layers' "
                       "weights and biases never train")
        elif any(s.kind == "optimizer" for s in earlier):
            why.append("a converter that makes new parameters (apex) leaves the optimizer "
                       "updating stale ones (torch's reuses them today, which hides it)")
        message = (
            f"`{convert.call.callee}` converts `{convert.target}` {what} (line "
            f"{earlier[0].statement.first_row}){helpers}: {', and '.join(why)}; convert before "
            "wrapping and before building the optimizer"
        )
        if "gloo" in module.backends and "SyncBatchNorm.convert_sync_batchnorm" in \
                convert.call.callee + convert.qualname:
            message += (" (this script uses gloo, on which torch's SyncBatchNorm raises in "
                        "training: `bnfix.torch.convert_sync` runs on CPU/gloo as well)")
        related = tuple(Related(s.through.path, s.through.span, f"`{s.qualname}` is defined here")
                        for s in inside if s.through is not None)
        fix = _bn103_fix(convert, earlier) if not inside else Fix(
            DISPLAY, "Convert to SyncBatchNorm before the wrap and the optimizer (move the "
                     "helper's call, or the conversion into the helper)")
        yield Finding("BN103", convert.call.span, message, fix, related)


def _bn103_fix(convert: ModelStep, earlier: list[ModelStep]) -> Fix:
    advice = Fix(DISPLAY, "Convert to SyncBatchNorm before the wrap and the optimizer")
    move = convert.move
    first = min(earlier, key=lambda s: s.statement.first_row)
    if move is None or not move.wrappable or not first.statement.wrappable or \
            any(s.statement.block != move.block for s in earlier):
        return advice
    lines = tuple((0, line) for line in convert.move_lines)
    edits = (InsertRows(first.statement.first_row, first.statement.indent, lines),
             DeleteRows(move.first_row, move.last_row))
    return Fix(UNSAFE, "Move the conversion before the wrap and the optimizer", edits)


# ---------------------------------------------------------------------------------------------
# BN104 bias-before-bn


@check("BN104")
def bias_before_bn(module: ModuleIR) -> Iterator[Finding]:
    for pair in module.bias_before_bn:
        layer, bn = pair.layer, pair.bn
        if (layer.framework == "torch") != (bn.api.framework == "torch"):
            continue
        if _built_in_no_call(bn) or frozen_in_inference(bn, module) or inference_only(bn):
            continue  # no model has the BN, or it subtracts a fixed mean: the bias counts
        if pair.switched and not _always_built(bn):
            continue  # `if is_batchnorm: x = BN()(x)`: where the test fails the bias counts
        switched = None  # the block's own parameter that sets the bias, True in some context
        if layer.bias is not None and not is_const(layer.bias.value, True):
            switched = _biased_by_default(layer.bias.value, bn)
            if switched is None:
                continue  # bias=False, or not known
        if layer.activation is not None and not is_const(layer.activation.value, None):
            continue  # an activation between the bias and the BN: the bias is not cancelled
        name = layer.bias_param
        if switched is not None:
            param, where = switched
            function = param.function
            owner = function.class_name or function.name
            message = (
                f"`{layer.call.callee}` adds a bias that the following `{bn.call.callee}` cancels "
                f"(BatchNorm subtracts the per-channel mean, bias included): `{name}` is "
                f"`{owner}`'s `{param.name}`, which is True {where}"
            )
            fix = Fix(DISPLAY, f"Pass `{param.name}=False` where `{owner}` is built with a BN "
                               f"after it, or make False the default of its `{param.name}`")
            yield Finding("BN104", layer.call.span, message, fix, _related(pair))
            continue
        message = (
            f"`{layer.call.callee}` adds a bias that the following `{bn.call.callee}` cancels "
            f"(BatchNorm subtracts the per-channel mean, bias included): `{name}=False` saves the "
            "parameters and their optimizer state"
        )
        if layer.container is not None:
            fix = Fix(DISPLAY, f"Pass `{name}=False` to the layers of `{layer.container}` that a "
                               "BN follows (this is the first one built)")
            yield Finding("BN104", layer.call.span, message, fix, _related(pair))
            continue
        if pair.unnormalized is not None:
            row = pair.unnormalized.start.row
            fix = Fix(DISPLAY, f"Drop the bias only where a BN follows: the same layer is also "
                               f"used without one (line {row}), where its bias is not cancelled "
                               f"(for instance `{name}=not <the switch that adds the BN>`)")
            yield Finding("BN104", layer.call.span, message, fix, _related(pair))
            continue
        kept = _bias_kept_by(module, name)
        if kept is not None:
            yield Finding("BN104", layer.call.span, message, Fix(DISPLAY, kept), _related(pair))
            continue
        if layer.bias is not None:
            edit = Edit(layer.bias.value_span, "False")
        elif layer.call.args_end is None:
            edit = Edit(Span.at(layer.call.close_paren), f"{name}=False")
        else:
            edit = Edit(Span.at(layer.call.args_end), f", {name}=False")
        yield Finding("BN104", layer.call.span, message,
                      Fix(UNSAFE, f"Drop the bias: `{name}=False`", (edit,)), _related(pair))


# Project-wide uses of a bias that dropping it would break, each with the reason the fix gives
# (the project's marks: see `bnfix.source.walk`).
_BIAS_NEEDED_BY = (
    ("loads_weights", ("Drop the bias (`{name}=False`) only with weights that lack it: the project "
                      "loads trained weights (for instance at {where}); a checkpoint saved with "
                      "this bias (and BN statistics that absorbed it) would no longer load "
                      "strictly")),
    ("bias_by_name", ("Drop the bias (`{name}=False`) only where no code looks it up: the project "
                     "reads bias parameters by name (for instance at {where}), and a dropped bias "
                     "breaks that lookup")),
    ("bias_used", ("Drop the bias (`{name}=False`) only where no code uses it: the project uses "
                  "layers' bias parameters without checking that they exist (for instance at "
                  "{where}: `None` once dropped)")),
)


def _bias_kept_by(module: ModuleIR, name: str) -> str | None:
    """Why the bias must stay until the user looks (the first project mark that needs it, the
    most telling one cited)."""
    for kind, reason in _BIAS_NEEDED_BY:
        marks = telling_first(module.marks_of(kind), module.neighbours)
        if marks:
            return reason.format(name=name, where=marks[0].where())
    return None


def _biased_by_default(value: object, bn: BNSite) -> tuple[FromParam, str] | None:
    """A layer's bias set by a parameter of the function (or class) that builds it, True in
    one of its calling contexts that builds the BN too: the default where it is built without
    it (pytorch-semseg's `conv2DBatchNorm(..., bias=True)` blocks, Attention-Gated-Networks'
    `conv5_p`), or a literal a call passes. With where that is."""
    if not isinstance(value, FromParam) or value.negated:
        return None
    function = value.function
    switches = _switches(bn, function)
    for binding in bindings(function):
        if _unbuilt(binding, switches):
            continue  # in this context the BN is not built (`if is_batchnorm:` is false)
        bound = binding.value(value)
        if is_const(bound, True):
            site = binding.innermost_site
            if site is None:
                return value, "by default (no call of it passes another value)"
            how = "by default" if value.name not in site.args else "as passed"
            return value, f"{how} at the call {_site_place(site)}"
    return None


BINDING_LIMIT = 64  # calling contexts read before giving up (then the finding stays)


def _switches(bn: BNSite, function: FunctionInfo) -> list[tuple[Condition, FromParam]]:
    """The conditions the BN is built under that test a parameter of `function` alone: the
    parameter itself (`if batch_norm:`) or its comparison with a literal (`if norm ==
    "batch":`)."""
    out = []
    for c in bn.conditions:
        owner = c.switch.function or function if c.switch is not None else None
        if owner is not None and c.switch is not None and c.switch.name in owner.params:
            out.append((c, FromParam(owner, c.switch.name, None)))
    return out


def _unbuilt(binding: Binding, switches: list[tuple[Condition, FromParam]],
             defaults: bool = True) -> bool:
    """In this calling context a switch the BN is built under is a constant that makes its
    test false (`defaults` False: a parameter of an outer function no call reaches is not
    known)."""
    return any(isinstance(value := binding.value(param, defaults), Const) and
               c.switch is not None and c.switch.holds(value.value) == c.negated
               for c, param in switches)


def _built_in_no_call(bn: BNSite) -> bool:
    """The BN sits under a switch parameter (`if batch_norm:`) that every call of the project
    leaves false (faster-rcnn-pytorch's `make_layers(cfg)` with `batch_norm=False`): no
    model of the project has it. A function nothing calls keeps its finding (a library's
    callers pass the switch), and so does one whose callers pass it on from a function
    nothing calls (swa's `VGG(batch_norm=...)`, built from a `kwargs` dict)."""
    function = bn.function
    if function is None or not function.call_sites:
        return False
    switches = _switches(bn, function)
    if not switches:
        return False
    contexts = list(bindings(function, limit=BINDING_LIMIT + 1))
    return len(contexts) <= BINDING_LIMIT and all(_unbuilt(b, switches, False) for b in contexts)


def _always_built(bn: BNSite) -> bool:
    """Every test the BN is built under is a switch parameter that every call of the project
    turns on (focal-tversky-unet's `UnetConv2D(..., is_batchnorm=True)` at all its calls,
    ZF_UNET's `batch_norm=True` by default): the BN always follows the layer."""
    function = bn.function
    if function is None or not function.call_sites:
        return False
    switches = _switches(bn, function)
    if not switches or len(switches) != len(bn.conditions):
        return False
    contexts = list(bindings(function, limit=BINDING_LIMIT + 1))
    return len(contexts) <= BINDING_LIMIT and all(
        isinstance(value := b.value(param, False), Const) and c.switch is not None
        and c.switch.holds(value.value) != c.negated for b in contexts for c, param in switches)


def _related(pair: BiasBeforeBN) -> tuple[Related, ...]:
    """The classes of other files that are the biased layer (a conv wrapper) or the BN (a BN
    subclass), where they are."""
    out = [pair.layer.origin] if pair.layer.origin is not None else []
    origin = pair.bn.origin
    if origin is not None:
        out.append(Related(origin.path, origin.span,
                           f"`{pair.bn.call.callee}` is a `{pair.bn.qualname}`"))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# BN105 frozen-bn-still-updating


def _puts_in_eval(module: ModuleIR, owner: str, function: FunctionInfo | None) -> bool:
    return any(m.kind == "eval" and m.target == owner and m.function is function
               for m in module.mode_calls)


@check("BN105")
def frozen_bn_still_updating(module: ModuleIR) -> Iterator[Finding]:
    if module.script_without_training:
        return  # a conversion or export script: nothing trains, nothing moves
    groups: dict[tuple[int, str], list[ParamFreeze]] = defaultdict(list)
    for frozen in module.param_freezes:
        owner_class = frozen.function.qualname.split(".", 1)[0] if frozen.function else None
        if owner_class is not None and owner_class in module.freezing_trains:
            continue  # its class re-applies the eval-mode freeze in train()
        if frozen.is_bn and not _puts_in_eval(module, frozen.owner, frozen.function):
            groups[(id(frozen.function), frozen.owner)].append(frozen)
    for (_, owner), frozen in groups.items():  # weight and bias of one BN: one finding
        if all(f.only_bias for f in frozen):
            continue  # the shift alone pinned (speechbrain's LiGRU `bias=False`): the scale trains
        first = min(frozen, key=lambda f: f.span.start)
        after = max((f.after for f in frozen), key=lambda s: s.last_row)
        switch = next((f.switch for f in frozen if f.switch is not None), None)
        how = f"requires_grad=`{switch}`, False by default" if switch else "requires_grad=False"
        message = (
            f"the parameters of BatchNorm `{owner}` stop training ({how}), but "
            f"`{owner}` stays in train mode: it still normalizes with batch statistics and its "
            "running mean/variance keep moving; put it in eval mode too (and re-apply that after "
            "every `model.train()`, see BN102)"
        )
        fix = Fix(DISPLAY, f"Call `{owner}.eval()` as well")
        if after.wrappable:
            # under the flag's test where a flag decides the freeze (`--train_bn` trains them)
            rows = ((0, f"if not {switch}:"), (1, f"{owner}.eval()")) if switch else \
                ((0, f"{owner}.eval()"),)
            insert = InsertRows(after.last_row + 1, after.indent, rows)
            fix = Fix(UNSAFE, f"Also put `{owner}` in eval mode" +
                      (f" when `{switch}` is False" if switch else ""), (insert,))
        yield Finding("BN105", first.span, message, fix)
