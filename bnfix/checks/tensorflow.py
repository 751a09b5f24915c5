"""TF1 training-graph rules: the four bugs of seed 000 (BN001-BN004), summed tower gradients
(BN005), a training flag that is not passed on (BN010), and an argument passed by position
into the wrong BN parameter (BN013, every framework)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from bnfix.checks import check
from bnfix.checks.names import is_evaluation
from bnfix.findings import Applicability, Edit, EditOp, Fix, Pos, Span, WrapStatements, shown_path
from bnfix.ir import (
    Arg,
    Binding,
    BNSite,
    CallInfo,
    CallSite,
    CollectionGet,
    Condition,
    Const,
    Finding,
    FromParam,
    FunctionInfo,
    GradientSum,
    ModuleIR,
    Related,
    TowerLoop,
    TrainOp,
    Unknown,
    Value,
    VarsExpr,
    VarsTerm,
    bindings,
    is_const,
)

UNSAFE = Applicability.UNSAFE
DISPLAY = Applicability.DISPLAY_ONLY


def _describe(value: Value | None) -> str:
    if value is None:
        return "not passed"
    if isinstance(value, FromParam):
        return f"parameter `{value.name}` of `{value.function.name}`"
    return f"`{value.text}`"


def _row(span: Span | None) -> str:
    return f"line {span.start.row}" if span else "the API default"


# ---------------------------------------------------------------------------------------------
# BN001 frozen-affine-in-training


class _Context(NamedTuple):
    trainable: Value | None
    training: Value | None
    binding: Binding


def _contexts(site: BNSite) -> Iterator[_Context]:
    """trainable/training of `site` in each calling context. A layer object gets `training`
    when it is called, so those calls are the contexts."""
    trainable = site.value("trainable")
    if site.api.kind == "function":
        for b in bindings(site.function):
            yield _Context(b.value(trainable), b.value(site.value("training")), b)
        return
    default = site.api.defaults.get("training")
    for layer_call in site.instance_calls:
        args = layer_call.args
        training: Value | None = args["training"].value if "training" in args else Const(
            default, repr(default), None)
        outer = training.function if isinstance(training, FromParam) else None
        for b in bindings(site.function):
            for inner in bindings(outer):
                yield _Context(b.value(trainable), inner.value(training), b)


def training_mode(site: BNSite) -> bool:
    """The site may run in training mode in some context (training not literally False)."""
    return any(not is_const(c.training, False) for c in _contexts(site))


def inference_only(site: BNSite) -> bool:
    """The BN is applied, and every application passes `training=False`: written there
    (H-DenseUNet's `BatchNormalization(...)(x, training=False)`), or a parameter that every
    call of its function passes as False (Mask R-CNN's heads built with `train_bn=False`). It
    always normalizes with its moving statistics, a fixed affine map. A default never counts:
    a Keras `call(self, x, training=False)` gets `training` from the layer that calls it."""
    if site.api.kind == "layer":
        return bool(site.instance_calls) and all(
            "training" in c.args and _passed_false(c.args["training"].value)
            for c in site.instance_calls)
    return "training" in site.args and _passed_false(site.args["training"].value)


def _passed_false(value: Value | None, depth: int = 3) -> bool:
    if isinstance(value, Const):
        return is_const(value, False) and value.span is not None
    if isinstance(value, FromParam) and not value.negated and depth > 0:
        sites = value.function.call_sites
        return bool(sites) and all(value.name in s.args and
                                   _passed_false(s.args[value.name], depth - 1) for s in sites)
    return False


@check("BN001")
def frozen_affine_in_training(module: ModuleIR) -> Iterator[Finding]:
    seen: set[Span] = set()  # one finding per `False` written here
    for site in module.all_bn_sites():
        if site.api.trainable_semantics != "affine":
            continue
        contexts = list(_contexts(site))
        bad = [c for c in contexts if is_const(c.trainable, False) and not is_const(c.training, False)]
        frozen = [c for c in contexts if is_const(c.trainable, False) and is_const(c.training, False)]
        groups: dict[tuple[Span | None, str | None], list[_Context]] = {}
        for context in bad:  # the contexts each decisive `False` freezes
            assert isinstance(context.trainable, Const)
            groups.setdefault((context.trainable.span, context.trainable.where), []).append(context)
        for (span, where), group in groups.items():
            if where is not None:
                continue  # the `False` is written in another file: reported there
            finding = _bn001(site, group, frozen)
            if finding.span not in seen:
                seen.add(finding.span)
                yield finding


def _bn001(site: BNSite, bad: list[_Context], frozen: list[_Context]) -> Finding:
    first = bad[0]
    literal = first.trainable
    assert isinstance(literal, Const)
    direct = site.args.get("trainable")
    origin = ""
    if literal.span is not None and (direct is None or literal.span != direct.value.span) \
            and not (site.origin is not None and _within(literal.span, site.call.span)):
        origin = f" (the `False` comes from {_row(literal.span)})" if not literal.negated else \
            f" (`not` of the `{literal.text}` on {_row(literal.span)})"
    mode = _describe(first.training)
    site_row = first.binding.innermost_site
    where = f" at the call {_call_place(site_row)}" if site_row else ""
    built = f"`{site.call.callee}`" if site.origin is None else _reached(site)
    message = (
        f"{built} is built with `trainable=False`{origin} but runs in training "
        f"mode (training is {mode}{where}): gamma and beta never train and stay at 1 and 0"
    )
    if site.api.frozen_drops_updates:
        message += (" (and as a Keras-backed layer it then adds no update ops either: its "
                    "moving mean and variance never update)")
    # where the user edits: the call site that passes the `False`, when one does (here);
    # else the BN call (the `False` is its argument, its wrapper's default or a constant)
    passed = literal.span is not None and (
        site.origin is not None or any(_within(literal.span, s.span)
                                       for _, s in first.binding.chain if not s.where))
    if passed:
        span = literal.span
    else:
        span = direct.span if direct is not None and site.origin is None else site.span
    related = [*_origin_related(site), *(
        _call_related(c.binding.innermost_site, "runs it in training mode") for c in bad[:1]
        if c.binding.innermost_site is not None and c.binding.innermost_site.where)]
    return Finding("BN001", span, message, _bn001_fix(site, bad, frozen), tuple(related))


def _reached(site: BNSite) -> str:
    """How a message names a BN built in another file: `tensorflow.layers.batch_normalization`
    (models/layers.py:6, reached through `Net` -> `conv_bn`)."""
    assert site.origin is not None
    return f"`{site.qualname}` ({site.origin.describe()})"


def _within(inner: Span, outer: Span) -> bool:
    return outer.start <= inner.start and inner.end <= outer.end


def _call_place(site: CallSite) -> str:
    """`on line 12`, or `in train.py:12` for a call made in another file."""
    if site.where:
        return f"in {shown_path(site.where)}:{site.span.start.row}"
    return f"on line {site.span.start.row}"


def _call_related(site: CallSite, what: str) -> Related:
    return Related(site.where, site.span, f"`{site.call.callee}` {what}")


def _origin_related(site: BNSite) -> list[Related]:
    if site.origin is None:
        return []
    return [Related(site.origin.path, site.origin.span, f"the BatchNorm `{site.qualname}` is built here")]


def _bn001_fix(site: BNSite, bad: list[_Context], frozen: list[_Context]) -> Fix:
    spans = {c.trainable.span for c in bad if isinstance(c.trainable, Const) and c.trainable.local}
    shared = {c.trainable.span for c in frozen if isinstance(c.trainable, Const)
              and c.trainable.local} & spans
    if spans and not shared and all(isinstance(c.trainable, Const) and c.trainable.local
                                    for c in bad):
        negated = {c.trainable.span: c.trainable.negated for c in bad
                   if isinstance(c.trainable, Const)}
        edits = tuple(Edit(span, "False" if negated[span] else "True")
                      for span in sorted(spans))  # type: ignore[type-var]
        return Fix(UNSAFE, "Set `trainable=True` so gamma and beta train", edits)
    # The same literal also freezes a BN that is in inference mode on purpose: pass
    # trainable=True at the training call sites instead of changing the shared default.
    raw = site.value("trainable")
    if isinstance(raw, FromParam) and raw.function is site.function:
        edits = []
        for c in bad:
            call_site = c.binding.innermost_site
            # (a callback's site is the helper's call, which does not call it with this name)
            if call_site is None or raw.name in call_site.args or call_site.where or \
                    "callback" in call_site.tags:
                places = ", ".join(sorted({_call_place(c.binding.innermost_site) for c in bad
                                           if c.binding.innermost_site is not None}))
                return Fix(DISPLAY, f"Pass `{raw.name}=True` where this BN trains ({places})", ())
            edits.append(_add_keyword(call_site.call, f"{raw.name}=True"))
        return Fix(UNSAFE, f"Pass `{raw.name}=True` at the call sites that train", tuple(edits))
    if site.origin is not None and "trainable" in site.settable and not site.unpacked:
        keyword = f"{site.settable['trainable']}=True"
        return Fix(UNSAFE, f"Pass `{keyword}` here so gamma and beta train",
                   (_add_keyword(site.call, keyword),))
    return Fix(DISPLAY, "Pass `trainable=True` where this BN trains", ())


def _add_keyword(call: CallInfo, text: str) -> Edit:
    if call.args_end is None:
        return Edit(Span.at(call.close_paren), text)
    return Edit(Span.at(call.args_end), f", {text}")


# ---------------------------------------------------------------------------------------------
# Tower scopes, shared by BN002 and BN003


class _ScopePlan(NamedTuple):
    name: str
    edits: tuple[EditOp, ...]


def _tower_scope(module: ModuleIR, tower: TowerLoop) -> _ScopePlan | None:
    """A name bound to one tower's name scope, with the edits that create it if needed:
    ` as tower_scope` added to the tower's name_scope, or a name_scope wrapped around the
    tower's device block."""
    if tower.name_scope is not None:
        if tower.name_scope.as_name:
            return _ScopePlan(tower.name_scope.as_name, ())
        name = module.fresh_name("tower_scope")
        return _ScopePlan(name, (Edit(Span.at(tower.name_scope.item_end), f" as {name}"),))
    block, prefix = tower.device_block, module.tf1_prefix
    if block is None or prefix is None or tower.loop_var is None or not tower.starts_at_zero:
        return None
    name = module.fresh_name("tower_scope")
    header = f"with {prefix}.name_scope('tower_%d' % {tower.loop_var}) as {name}:"
    return _ScopePlan(name, (WrapStatements(block.first_row, block.last_row, header),))


def _inside_block(tower: TowerLoop, row: int) -> bool:
    block = tower.device_block
    return block is not None and block.first_row <= row <= block.last_row


# ---------------------------------------------------------------------------------------------
# BN002 unscoped-update-ops


@check("BN002")
def unscoped_update_ops(module: ModuleIR) -> Iterator[Finding]:
    if not _builds_update_ops(module):
        return
    for get in module.collection_gets:
        if get.key != "UPDATE_OPS" or get.scoped:
            continue
        if get.tower is None:
            site = _called_where(get.function, "tower")
            if site is not None:
                yield _per_tower_finding(get, site)
            elif (site := _called_where(get.function, "after_tower")) is not None:
                yield _after_towers_finding(get, site)
            continue
        tower = get.tower
        where = "inside" if get.inside_tower else "after"
        collects = (
            "adds every tower built so far on each iteration (duplicates)"
            if get.inside_tower and get.usage == "accumulate"
            else "collects the update ops of every tower built so far, and each tower's step "
                 "depends on them" if get.inside_tower
            else "collects the update ops of every tower"
        )
        message = (
            f"`{get.call.callee}(UPDATE_OPS)` without a scope {where} the tower loop at line "
            f"{tower.span.start.row} {collects}: the shared moving mean/variance are then updated "
            "once per tower each step; collect one tower's updates (its name scope"
            + (", in the first tower only)" if get.inside_tower else ")")
        )
        yield Finding("BN002", get.call.span, message, _bn002_fix(module, get, tower))


SEARCH_DEPTH = 4  # calls followed from a BN site back to a region (a tower loop, a scope)

Inside = Callable[[FunctionInfo | None, int], bool]


def reaches(site: BNSite, inside: Inside) -> bool:
    """The BN site runs inside a region: it is written there, or its function is called from
    there (through at most SEARCH_DEPTH calls known in the module)."""
    if inside(site.function, site.span.start.row):
        return True
    frontier, seen = [site.function], set()
    for _ in range(SEARCH_DEPTH):
        following = []
        for function in frontier:
            if function is None or id(function) in seen:
                continue
            seen.add(id(function))
            for call in function.call_sites:
                if inside(call.caller, call.span.start.row):
                    return True
                following.append(call.caller)
        frontier = following
    return False


def in_loop(tower: TowerLoop) -> Inside:
    def inside(function: FunctionInfo | None, row: int) -> bool:
        return function is tower.function and tower.span.start.row <= row <= tower.body_last_row
    return inside


def _builds_update_ops(module: ModuleIR) -> bool:
    """Some BN the module builds or reaches publishes update ops (with no BN known here, the
    project's BN APIs answer); a hand-written BN publishes its own with
    `tf.add_to_collection(UPDATE_OPS, ...)`, here or in code this module calls."""
    sites = module.all_bn_sites()
    if sites:
        return any(s.api.updates == "update_ops" for s in sites) or \
            any(m.kind == "registers:UPDATE_OPS" for m in module.marks) or \
            bool(module.reached("registers:UPDATE_OPS"))
    return any(api.updates == "update_ops" for api in module.project_apis.values()) or \
        not module.project_apis


def _called_where(function: FunctionInfo | None, tag: str, depth: int = 2) -> CallSite | None:
    """A call of `function` (or of a function calling it) made where `tag` says (`tower`:
    inside a tower loop, `after_tower`: after one in the same function), here or in another
    file of the project."""
    if function is None or depth == 0:
        return None
    for site in function.call_sites:
        if tag in site.tags:
            return site
    for site in function.call_sites:
        found = _called_where(site.caller, tag, depth - 1)
        if found is not None:
            return found
    return None


def _per_tower_finding(get: CollectionGet, site: CallSite) -> Finding:
    assert get.function is not None
    message = (
        f"`{get.call.callee}(UPDATE_OPS)` without a scope in `{get.function.name}`, which runs "
        f"once per tower (called inside the tower loop {_call_place(site)}): from the second "
        "tower on it collects the update ops of every tower built so far, so the shared moving "
        "mean/variance are updated several times per step; collect the current tower's updates "
        "(pass its name scope in)"
    )
    fix = Fix(DISPLAY, "Pass the tower's name scope and collect `UPDATE_OPS` from it", ())
    return Finding("BN002", get.call.span, message, fix,
                   (_call_related(site, "calls it once per tower"),))


def _after_towers_finding(get: CollectionGet, site: CallSite) -> Finding:
    assert get.function is not None
    message = (
        f"`{get.call.callee}(UPDATE_OPS)` without a scope in `{get.function.name}`, which is "
        f"called after a tower loop {_call_place(site)}: it collects the update ops of every "
        "tower, so the shared moving mean/variance are updated once per tower each step; "
        "collect one tower's updates (pass its name scope in)"
    )
    fix = Fix(DISPLAY, "Pass one tower's name scope and collect `UPDATE_OPS` from it", ())
    return Finding("BN002", get.call.span, message, fix,
                   (_call_related(site, "calls it after the tower loop"),))


def _bn002_fix(module: ModuleIR, get: CollectionGet, tower: TowerLoop) -> Fix:
    advice = Fix(DISPLAY, "Collect UPDATE_OPS from one tower's name scope", ())
    sites = module.all_bn_sites()
    if sites and not any(reaches(s, in_loop(tower)) for s in sites):
        # the BN known here is built in another loop (a model-building pass before the
        # gradients'): this loop's name scope holds none of its update ops
        return Fix(DISPLAY, "Collect UPDATE_OPS from the name scope of one tower of the loop "
                            "that builds the BN", ())
    plan = _tower_scope(module, tower)
    if plan is None or get.call.args_end is None or get.call.trailing_comma:
        return advice
    row = get.call.span.start.row
    if get.inside_tower:
        created = tower.name_scope is None
        if (created and not _inside_block(tower, row)) or (not created and not get.row_in_loop_after_scope):
            return advice
        # each tower depends on what it collects: scoping alone would still run every tower's
        # updates (youtube-8m's per-tower `control_dependencies(update_ops)`); the first
        # tower's, only in the first tower, run once
        if get.usage in ("assign", "accumulate") and tower.starts_at_zero and tower.loop_var:
            scoped = _add_keyword(get.call, plan.name)
            edits = (
                *plan.edits,
                scoped,
                Edit(Span.at(get.call.span.end), f" if {tower.loop_var} == 0 else []"),
            )
            return Fix(UNSAFE, "Collect the UPDATE_OPS of the first tower only", edits)
        return advice
    if not get.tower_always:  # another path reaches the read without the loop's scope name
        return Fix(DISPLAY, "Collect UPDATE_OPS from one tower's name scope (the tower loop "
                            "does not run on every path to this read)", ())
    edits = (*plan.edits, _add_keyword(get.call, plan.name))
    return Fix(UNSAFE, f"Collect the UPDATE_OPS of one tower (`{plan.name}`, the last built)", edits)


# ---------------------------------------------------------------------------------------------
# BN003 update-ops-not-run


def stats_never_read(sites: list[BNSite]) -> bool:
    """Every BN is hard-wired to batch statistics (`training=True` written at the BN call or
    at each call of the layer object): the moving statistics are never used, so how (or
    whether) they update does not matter. A flag passed in from elsewhere is not hard-wired:
    another caller (an evaluation script) may pass False."""
    return all(hard_wired(s) for s in sites)


def hard_wired(site: BNSite) -> bool:
    if site.api.updates not in ("update_ops", "layer"):
        return False  # statistics kept outside the call (F.batch_norm's running_mean) are read elsewhere
    if site.api.kind != "function":
        calls = site.instance_calls
        return bool(calls) and all(
            "training" in c.args and is_const(c.args["training"].value, True)
            and c.args["training"].value.span == c.args["training"].value_span for c in calls)
    value = site.value("training")
    if not (isinstance(value, Const) and value.value is True and value.span is not None):
        return False
    if site.origin is None:
        return value.where is None and _within(value.span, site.call.span)
    return value.where == site.origin.path and _within(value.span, site.origin.span)


@check("BN003")
def update_ops_not_run(module: ModuleIR) -> Iterator[Finding]:
    candidates = [s for s in module.all_bn_sites()
                  if s.api.updates == "update_ops"
                  and not is_const(s.value("updates_collections"), None)]
    if not candidates:
        return
    for op in module.train_ops:
        if op.adds_update_ops or "UPDATE_OPS" in op.control_keys:
            continue
        sites = [s for s in candidates if _trains_for(s, op)]
        if not sites or stats_never_read(sites):
            continue
        names = ", ".join(sorted({f"`{s.call.callee}`" if s.origin is None else _reached(s)
                                  for s in sites})[:3])
        if len(sites) > 3:
            names += f" and {len(sites) - 3} more"
        reached = next((s for s in sites if s.origin is not None), None)
        related = tuple(_origin_related(reached)) if reached is not None else ()
        if op.under_control_deps:
            keys = ", ".join(sorted(k for k in op.control_keys if k != "?")) or "other ops"
            cause = f"its control_dependencies hold {keys}, not UPDATE_OPS"
        else:
            cause = "it is not built under `control_dependencies(UPDATE_OPS)`"
        message = (
            f"the train op `{op.call.callee}(...)` never runs the batch-norm update ops ({cause}):"
            f" the moving mean/variance of {names} stay at 0 and 1 and inference uses them"
        )
        yield Finding("BN003", op.call.span, message, _bn003_fix(module, op), related)


def _trains_for(site: BNSite, op: TrainOp) -> bool:
    """The BN is in the graph the train op trains, in training mode there: some calling context
    of the BN passes through the train op's function or one of its callers (the code that
    builds the model next to the train op), and is not literally in inference mode."""
    around = _ancestors(op.function)
    return any(_passes_through(site, context.binding, around)
               and not is_const(context.training, False)
               and not _branch_denies(site, context.binding, op) for context in _contexts(site))


def _passes_through(site: BNSite, binding: Binding, around: set[int]) -> bool:
    """The calling context of the BN runs through one of the functions `around` (by id, 0 for
    module-level code)."""
    functions = {id(site.function) if site.function is not None else 0}
    functions |= {id(s.caller) if s.caller is not None else 0 for _, s in binding.chain}
    return bool(functions & around)


def _branch_denies(site: BNSite, binding: Binding, op: TrainOp) -> bool:
    """The BN is built only under a test that the train op's branch denies: `if
    params.use_batch_norm:` around the BN, and the train op in the `else` of the same test in
    the function that builds the model (the test's names carried up the calls that pass them
    on as they are)."""
    if not site.conditions or not op.conditions:
        return False
    for condition in site.conditions:
        carried = _carried(condition, site.function, binding, op.function)
        if carried is not None and any(carried.excludes(c) for c in op.conditions):
            return True
    return False


def _carried(condition: Condition, function: FunctionInfo | None, binding: Binding,
             target: FunctionInfo | None) -> Condition | None:
    """`condition` (a test in `function`) as written in `target`, a caller of it in
    `binding`: each name it reads must be a parameter that the call passes a plain name of the
    caller's for; None where it is not so carried."""
    if function is target:
        return condition
    names = condition.uses
    for callee, site in binding.chain:
        passed = {}
        for name in names:
            value = callee.param_value(site, name) if name in callee.params else None
            written = value.name if isinstance(value, FromParam) and not value.negated else \
                value.text if isinstance(value, Unknown) else None
            if written is None or not written.isidentifier():
                return None
            passed[name] = written
        if not passed:
            return None
        condition = condition.renamed(passed)
        names = condition.uses
        if site.caller is target:
            return condition
    return None


def _ancestors(function: FunctionInfo | None, depth: int = 3) -> set[int]:
    """The function (0 for module-level code) and its callers, `depth` levels up."""
    out = {id(function) if function is not None else 0}
    frontier = [function]
    for _ in range(depth):
        following = []
        for f in frontier:
            for s in f.call_sites if f is not None else ():
                key = id(s.caller) if s.caller is not None else 0
                if key not in out:
                    out.add(key)
                    following.append(s.caller)
        frontier = following
    return out


def _bn003_fix(module: ModuleIR, op: TrainOp) -> Fix:
    advice = Fix(DISPLAY, "Build the train op under `control_dependencies(UPDATE_OPS)`", ())
    prefix = module.tf1_prefix
    if prefix is None or not op.statement.wrappable:
        return advice
    scope, edits = "", ()
    if op.after_tower is not None:
        plan = _tower_scope(module, op.after_tower)
        if plan is None:
            return advice
        scope, edits = f", {plan.name}", plan.edits
    header = (
        f"with {prefix}.control_dependencies({prefix}.get_collection("
        f"{prefix}.GraphKeys.UPDATE_OPS{scope})):"
    )
    wrap = WrapStatements(op.statement.first_row, op.statement.last_row, header)
    return Fix(UNSAFE, "Run the UPDATE_OPS before each training step", (*edits, wrap))


# ---------------------------------------------------------------------------------------------
# BN004 double-ema-of-bn-stats


def _mentions(site: BNSite, canonical: str, key: str) -> bool:
    """The BN's `canonical` argument (a collections spec) names collection `key`."""
    value = site.value(canonical)
    return value is not None and key in getattr(value, "text", "")


def _registers(module: ModuleIR, key: str, user: FunctionInfo | None) -> list[str]:
    """Where BN moving statistics of the BN used by `user`'s graph join collection `key`: a BN
    whose API registers there (contrib/slim: MODEL_VARIABLES), one whose
    `variables_collections` names it, or first-party code that adds variables to it (a
    custom BN) — built in the code `user` (or its callers) runs. When the model is built by
    code the analysis cannot follow (a registry of networks), nothing is assumed: guessing
    from the BN the rest of the project builds proved wrong as often as right on real code."""
    around = _ancestors(user)
    sites = [s for s in module.all_bn_sites() if _runs_under(s.function, around)]
    places = [f"`{s.call.callee}` at line {s.span.start.row}" for s in sites
              if key in s.api.registers or _mentions(s, "variables_collections", key)]
    by_name = {f.qualname: f for f in module.functions}
    places += [m.where() for m in module.marks if m.kind == f"registers:{key}" and (
        m.function is None or _runs_under(by_name.get(m.function), around))]
    places += [f"{shown_path(o.path)}:{o.span.start.row}"
               for o in module.reached(f"registers:{key}")]
    places += [f"a BN in the graph its caller builds {_call_place(s)}" for s in _graph_callers(user)
               if f"registers:{key}" in s.facts]
    return places


def _graph_callers(function: FunctionInfo | None) -> list[CallSite]:
    """Calls of `function` (or of its callers) from other files: the graph a helper works on
    is built by them."""
    if function is None:
        return []
    out, frontier = [], [function]
    for _ in range(3):
        following = []
        for f in frontier:
            for site in f.call_sites if f is not None else ():
                if site.where:
                    out.append(site)
                following.append(site.caller)
        frontier = following
    return out


def _runs_under(function: FunctionInfo | None, around: set[int]) -> bool:
    """Code in `function` runs when one of the `around` functions runs: it is module-level
    code, one of them, or some calling context of it passes through one."""
    if function is None or id(function) in around:
        return True
    return any((id(s.caller) if s.caller is not None else 0) in around
               for b in bindings(function) for _, s in b.chain)


def _bn_in_use(module: ModuleIR, user: FunctionInfo | None) -> bool:
    around = _ancestors(user)
    return any(_runs_under(s.function, around) for s in module.all_bn_sites()) or \
        any("builds_bn" in s.facts for s in _graph_callers(user))


def _callers_polluted(user: FunctionInfo | None) -> list[CallSite]:
    """Calls of `user` (or its callers) from other files whose graph holds a BN that puts its
    moving statistics in TRAINABLE_VARIABLES."""
    return [s for s in _graph_callers(user) if "registers:TRAINABLE_VARIABLES" in s.facts]


@check("BN004")
def double_ema_of_bn_stats(module: ModuleIR) -> Iterator[Finding]:
    polluted = [s for s in module.all_bn_sites()
                if _mentions(s, "variables_collections", "TRAINABLE_VARIABLES")]
    for apply in module.ema_applies:
        var_list = apply.var_list
        if var_list is None:
            continue
        holders = _stat_holders(module, var_list, apply.function)
        if holders:
            terms = ", ".join(f"`{t.text}`" for t, _ in holders)
            origin = f" through `{var_list.local_name}`" if var_list.local_name else ""
            evidence = "; ".join(sorted({why for _, why in holders}))
            message = (
                f"`{apply.call.callee}(...)` also averages the BN moving mean/variance ({terms}"
                f"{origin}: {evidence}): they are already exponential moving averages, so their "
                "EMA shadows lag twice behind and are what an evaluation restore loads; average "
                "the trainable variables only"
            )
            yield Finding("BN004", apply.call.span, message, _bn004_fix(module, var_list),
                          _restore_related(module))
        elif "trainable" in var_list.tags and (
                polluted or (callers := _callers_polluted(apply.function))):
            if polluted:
                first = polluted[0]
                where = f"line {first.span.start.row}" if first.origin is None else \
                    first.origin.describe()
                related = tuple(_origin_related(first))
            else:  # an EMA helper: the BN is in the graph its caller builds
                call = callers[0]
                where = f"in the graph its caller builds {_call_place(call)}"
                related = (_call_related(call, "builds that graph"),)
            message = (
                f"`{apply.call.callee}(...)` averages trainable variables, but a BN ({where}) "
                "puts its moving statistics in TRAINABLE_VARIABLES (`variables_collections`): "
                "they get a second moving average (and gradients)"
            )
            fix = Fix(DISPLAY, "Keep the moving statistics out of TRAINABLE_VARIABLES", ())
            yield Finding("BN004", apply.call.span, message, fix, related)


def _stat_holders(module: ModuleIR, var_list: VarsExpr,
                  user: FunctionInfo | None) -> list[tuple[VarsTerm, str]]:
    """The terms of an EMA's var_list that hold BN moving statistics, and why."""
    out = []
    for term in var_list.terms:
        if "stats:global" in term.tags and _bn_in_use(module, user):
            out.append((term, "every BN's moving statistics are global variables"))
        elif "stats:model" in term.tags:
            places = _registers(module, "MODEL_VARIABLES", user)
            if places:
                out.append((term, f"model variables hold them ({places[0]})"))
        elif "stats:moving_average" in term.tags:
            places = _registers(module, "MOVING_AVERAGE_VARIABLES", user)
            if places:
                reason = f"the BN registers them in MOVING_AVERAGE_VARIABLES ({places[0]})"
                out.append((term, reason))
    return out


def _holds_stats(term: VarsTerm) -> bool:
    return any(tag.startswith("stats:") for tag in term.tags)


def _restore_related(module: ModuleIR) -> tuple[Related, ...]:
    marks = module.marks_of("ema_restore")
    return tuple(Related(m.path, m.span, "restores the EMA shadows (the fix must keep this "
                                         "working)") for m in marks[:3])


def _bn004_fix(module: ModuleIR, var_list: VarsExpr) -> Fix:
    restores = module.marks_of("ema_restore")
    if restores:
        places = ", ".join(m.where() for m in restores[:3])
        return Fix(DISPLAY, "Average the trainable variables only, and restore the BN moving "
                            f"statistics themselves where the EMA shadows are restored ({places}): "
                            "changing one side alone breaks that restore", ())
    prefix = module.tf1_prefix
    kept = [t.text for t in var_list.terms if not _holds_stats(t)]
    if not any("trainable" in t.tags for t in var_list.terms if not _holds_stats(t)):
        if prefix is None:
            return Fix(DISPLAY, "Average `trainable_variables()` only", ())
        kept.insert(0, f"{prefix}.trainable_variables()")
    return Fix(UNSAFE, "Average trainable variables only", (Edit(var_list.span, " + ".join(kept)),))


# ---------------------------------------------------------------------------------------------
# BN005 summed-tower-gradients


@check("BN005")
def summed_tower_gradients(module: ModuleIR) -> Iterator[Finding]:
    if module.loss_scaled_per_tower:
        return  # each tower's loss is already divided by the tower count: the sum is right
    for total in module.gradient_sums:
        if total.divided:
            continue
        callers = [s for s in total.function.call_sites if s.where] if total.function else []
        if callers and all("loss_scaled_per_tower" in s.facts for s in callers):
            continue  # every caller (in other files) divides each tower's loss
        what = "tf.add_n" if total.kind == "add_n" else "tf.reduce_sum(..., 0)"
        message = (
            f"tower gradients are combined with `{what}` (a sum over the towers) without a "
            "division by the tower count and without per-tower loss scaling: each step applies "
            "N times the single-device update; average them"
        )
        yield Finding("BN005", total.call.span, message, _bn005_fix(total))


def _bn005_fix(total: GradientSum) -> Fix:
    call = total.call
    if total.kind == "reduce_sum":
        name = "reduce_sum"
        if "\n" in call.callee or not call.callee.endswith(name):
            return Fix(DISPLAY, "Use `reduce_mean` over the tower axis", ())
        start = Pos(call.span.start.row, call.span.start.col + len(call.callee) - len(name))
        edit = Edit(Span(start, Pos(start.row, start.col + len(name))), "reduce_mean")
        return Fix(UNSAFE, "Average over the tower axis (`reduce_mean`)", (edit,))
    if total.loop_var is None:
        return Fix(DISPLAY, "Divide the sum by the number of towers", ())
    divide = f" / len({total.loop_var})"
    if total.nested:
        edits = (Edit(Span.at(call.span.start), "("), Edit(Span.at(call.span.end), divide + ")"))
    else:
        edits = (Edit(Span.at(call.span.end), divide),)
    return Fix(UNSAFE, f"Divide by the number of towers (`len({total.loop_var})`)", edits)


# ---------------------------------------------------------------------------------------------
# BN010 hardcoded-training-mode

def _literal_true(arg: Arg | None) -> bool:
    """`training=True` written at the call itself (not a constant defined elsewhere)."""
    return arg is not None and is_const(arg.value, True) and arg.value.span == arg.value_span


@check("BN010")
def hardcodedtraining_mode(module: ModuleIR) -> Iterator[Finding]:
    for site in module.bn_sites:
        places = [(site.args.get("training"), site.function, site.call.callee)]
        places += [(c.args.get("training"), c.function, c.call.callee) for c in site.instance_calls]
        for arg, function, callee in places:
            if arg is None or not _literal_true(arg) or function is None:
                continue
            flag = function.training_flag
            if flag is not None and any(flag in c.uses for c in site.conditions):
                continue  # `if training: bn(x, training=True) else: ...`: the flag decides
            written = f"{arg.name}=True" if arg.keyword else "True"
            if flag is not None:
                message = (
                    f"`{callee}(..., {written})` inside `{function.name}`, which receives the "
                    f"training flag `{flag}`: this BN always normalizes with batch statistics "
                    "and updates its moving averages, also when the model is evaluated; pass the flag"
                )
                yield Finding("BN010", arg.span, message, _unless_unupdated(
                    module, [site], _bn010_fix(module, arg, flag, function, site)))
            elif is_evaluation(function):
                message = (
                    f"`{callee}(..., {written})` in the evaluation function `{function.name}`: "
                    "evaluation then normalizes with the batch's statistics (results depend on "
                    "the batch) and moves the moving averages; use training=False"
                )
                fix = Fix(UNSAFE, "Evaluate in inference mode", (Edit(arg.value_span, "False"),))
                yield Finding("BN010", arg.span, message, _unless_unupdated(module, [site], fix))
    yield from _model_in_training_mode(module)


def _unless_unupdated(module: ModuleIR, sites: list[BNSite], fix: Fix) -> Fix:
    """A BN010 fix makes the BN read its moving statistics; where they publish update ops that
    no code of the project runs (it has train ops, none runs UPDATE_OPS, nothing reads the
    collection), they stay at 0 and 1 and the fix makes inference wrong: display-only, with
    the train op to fix first."""
    if not fix.edits or not any(s.api.updates == "update_ops" and
                                not is_const(s.value("updates_collections"), None) for s in sites):
        return fix
    unrun = module.marks_of("update_ops_unrun")
    if not unrun or module.has_mark("update_ops_read"):
        return fix
    return Fix(DISPLAY, f"{fix.message}, after making the train op run the UPDATE_OPS: no code of "
                        f"the project runs them (the train op at {unrun[0].where()} does not; see "
                        "BN003), so the moving statistics this makes the BN use stay at 0 and 1",
               ())


def _model_in_training_mode(module: ModuleIR) -> Iterator[Finding]:
    """`model(x, training=True)` in an evaluation function, the model (or layer) an object of
    this file, in a file that builds or reaches BN: its BN layers run in training mode."""
    if not module.all_bn_sites():
        return
    seen = {c.args["training"].span for s in module.bn_sites for c in s.instance_calls
            if "training" in c.args} | {s.args["training"].span for s in module.bn_sites
                                         if "training" in s.args}
    for call in module.training_calls:
        arg = call.arg
        if arg.span in seen or not _literal_true(arg) or not is_evaluation(call.function):
            continue
        assert call.function is not None
        message = (
            f"`{call.target}(..., training=True)` in the evaluation function "
            f"`{call.function.name}`: the BatchNorm layers it runs then normalize with the "
            "batch's statistics (results depend on the batch) and move their moving averages "
            "with evaluation data; use training=False"
        )
        fix = Fix(UNSAFE, "Evaluate in inference mode", (Edit(arg.value_span, "False"),))
        yield Finding("BN010", arg.span, message,
                      _unless_unupdated(module, module.all_bn_sites(), fix))


def _bn010_fix(module: ModuleIR, arg: Arg, flag: str, function: FunctionInfo,
               site: BNSite) -> Fix:
    param = function.params.get(flag)
    default = param.default if param is not None else None
    accepted = isinstance(default, Const) and (
        isinstance(default.value, bool) or (default.value is None and site.api.training_none))
    if default is not None and not accepted:
        return Fix(DISPLAY, f"Pass the training flag (`{flag}` defaults to `{default.text}`, "
                            "which the BN API rejects: resolve it to a bool first)")
    if flag != "mode":
        return Fix(UNSAFE, f"Pass the function's `{flag}`", (Edit(arg.value_span, flag),))
    train = module.spell("tensorflow.estimator.ModeKeys.TRAIN")
    if train is None:
        return Fix(DISPLAY, "Pass `mode == tf.estimator.ModeKeys.TRAIN`", ())
    return Fix(UNSAFE, f"Pass `mode == {train}`", (Edit(arg.value_span, f"mode == {train}"),))


# ---------------------------------------------------------------------------------------------
# BN013 misplaced-positional-argument


@check("BN013")
def misplaced_positional_argument(module: ModuleIR) -> Iterator[Finding]:
    # what the module passes as a BN's training flag: at its own BN calls, and to the
    # project's functions that build one (`conv_bn(x, ..., self.training)`)
    flags = {a.value_text for s in module.bn_sites
             if (a := s.args.get("training")) is not None and a.keyword}
    flags |= {text for s in module.reached_sites
              if (text := getattr(s.bound.get("training"), "text", None))}
    for site in module.bn_sites:
        canonical = {id(a): key for key, a in site.args.items()}
        positional = sorted((a for a in site.args.values() if not a.keyword),
                            key=lambda a: a.span.start)
        for arg in positional:
            why = _misplaced(site, canonical[id(arg)], arg, positional, flags)
            if why is None:
                continue
            message = (
                f"`{site.call.callee}(...)` receives `{arg.value_text}` by position as its "
                f"`{arg.name}`: {why}"
            )
            # a flag in `axis` moves to `training=` when no positional argument follows it
            movable = why is TRAINING_IN_AXIS and arg is positional[-1]
            fix = Fix(UNSAFE, f"Pass it as `training={arg.value_text}`",
                      (Edit(arg.value_span, f"training={arg.value_text}"),)) if movable else \
                Fix(DISPLAY, "Pass the value by keyword to the parameter it was meant for", ())
            yield Finding("BN013", arg.span, message, fix)


TRAINING_IN_AXIS = (  # also how the check knows the case (by identity)
    "that is the training flag, so the layer normalizes over another axis in each mode and "
    "`training` keeps its default (False: batch statistics are never used or updated); pass it "
    "as `training=`"
)


def _misplaced(site: BNSite, param: str, arg: Arg, positional: list[Arg],
               flags: set[str]) -> str | None:
    """Why a positional argument cannot be meant for the parameter it lands in (`param`, in
    bnfix's vocabulary: `epsilon` for torch's `eps`), if it cannot."""
    value, first = arg.value, positional[0]
    if isinstance(value, Const) and isinstance(value.value, bool) and \
            param in ("epsilon", "axis", "momentum"):
        return (f"a boolean there is read as the number {int(value.value)}; it was meant for "
                "another parameter (`training`, `affine`, `center`/`scale`): pass it by keyword")
    if param == "epsilon":
        if arg is not first and arg.value_text == first.value_text:
            return (f"the same value as its `{first.name}`: each variance gets that much added "
                    "before the square root, so the layer barely normalizes (the second "
                    "positional argument of `nn.BatchNorm2d` is `eps`, not the channel count)")
        if isinstance(value, Const) and isinstance(value.value, (int, float)) and value.value >= 1:
            return ("an epsilon of 1 or more swamps the variance (the default is 1e-5 or 1e-3), "
                    "so the layer barely normalizes; it was meant for another parameter")
    if param == "axis" and (arg.value_text in flags or (
            isinstance(value, FromParam) and site.function is not None and
            value.name == site.function.training_flag)):
        return TRAINING_IN_AXIS
    return None


# ---------------------------------------------------------------------------------------------
# BN014 training-flag-never-passed


@check("BN014")
def training_flag_never_passed(module: ModuleIR) -> Iterator[Finding]:
    if not module.train_ops:
        return
    seen: set[Span] = set()
    for site in module.all_bn_sites():
        if site.span in seen or not _flag_never_passed(site):
            continue
        op = next((op for op in module.train_ops if _in_graph_of(site, op)), None)
        if op is None:
            continue
        seen.add(site.span)
        what = f"`{site.call.callee}`" if site.origin is None else _reached(site)
        message = (
            f"{what} is never given `training`, which defaults to False: in the graph that "
            f"`{op.call.callee}(...)` on line {op.call.span.start.row} trains, it normalizes "
            "with its moving mean and variance, which nothing updates (they stay 0 and 1), so "
            "BN never uses batch statistics and the model trains without it"
        )
        fix = Fix(DISPLAY, "Pass `training=<flag>` (True while training, False in evaluation) "
                           "and run the update ops with the train op (BN003): with `training` "
                           "alone, evaluation would read the moving statistics nothing updates")
        yield Finding("BN014", site.call.span, message, fix, tuple(_origin_related(site)))


def _flag_never_passed(site: BNSite) -> bool:
    """A BN whose API defaults `training` to False (TF1's `tf.layers`) and that is never given
    one: not at the call, not through `*args`/`**kwargs`, not where a layer object is applied.
    A call with a non-literal positional argument after the input is left to BN013 (a flag
    passed in the wrong place)."""
    if site.api.defaults.get("training") is not False or site.unpacked or "training" in site.bound:
        return False
    positional = sorted((a for a in site.args.values() if not a.keyword), key=lambda a: a.span.start)
    if "training" in site.args or any(not isinstance(a.value, Const) for a in positional[1:]):
        return False
    if site.api.kind == "layer":
        return bool(site.instance_calls) and all("training" not in c.args
                                                 for c in site.instance_calls)
    return True


def _in_graph_of(site: BNSite, op: TrainOp) -> bool:
    """The BN is built by the code that builds the train op's graph: some calling context of
    it passes through the train op's function or one of its callers."""
    around = _ancestors(op.function)
    return any(_passes_through(site, binding, around) for binding in bindings(site.function))
