"""BN006 unsynced-bn-multi-device: plain BatchNorm where several devices train one model — TF1
tower loops, tf.distribute strategy scopes, torch DDP / Horovod. Each replica then normalizes
with its own slice of the batch, and (outside TF1's shared variables) keeps its own moving
statistics."""

from __future__ import annotations

import re
from collections.abc import Iterator

from bnfix.checks import check
from bnfix.checks.keras import built_by, frozen_in_inference
from bnfix.checks.names import telling_first
from bnfix.checks.tensorflow import Inside, in_loop, reaches, training_mode
from bnfix.findings import Applicability, Edit, EditOp, Fix, InsertRows, Span, WrapStatements
from bnfix.ir import (
    BNSite,
    DeviceScope,
    Finding,
    FunctionInfo,
    LibraryModel,
    ModelStep,
    ModuleIR,
    Related,
    TowerLoop,
    is_const,
)

UNSAFE = Applicability.UNSAFE
DISPLAY = Applicability.DISPLAY_ONLY
COST = "SyncBN costs one collective per BN layer per step"
SYNC_TOWERS = "bnfix.tf1.sync_towers"
TORCH_SYNC = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
BNFIX_SYNC = "bnfix.torch.convert_sync"


def _lines(sites: list[BNSite]) -> str:
    """Where the BN is built, by place in this file (a call that reaches several BN through
    other functions is one place: `Net` at line 5, 50 BatchNorm calls in all)."""
    places = list(dict.fromkeys((s.call.callee, s.span.start.row) for s in sites))
    callee, row = places[0]
    more = f" and {len(places) - 1} more" if len(places) > 1 else ""
    total = f", {len(sites)} BatchNorm calls in all" if len(sites) > len(places) else ""
    return f"`{callee}` at line {row}{more}{total}"


def _import(module: ModuleIR, qualname: str) -> tuple[str, tuple[EditOp, ...]]:
    """`qualname` as this file can write it, and the import edit when it must be added."""
    spelled = module.spell(qualname)
    if spelled is not None:
        return spelled, ()
    package = qualname.rsplit(".", 1)[0]
    return qualname, (InsertRows(module.import_row, "", ((0, f"import {package}"),)),)


@check("BN006")
def unsynced_bn_multi_device(module: ModuleIR) -> Iterator[Finding]:
    yield from _towers(module)
    yield from _strategy_scopes(module)
    yield from _replica_wraps(module)


# ---------------------------------------------------------------------------------------------
# TF1 tower loops


def _towers(module: ModuleIR) -> Iterator[Finding]:
    for tower in (t for t in module.tower_loops if not t.synced):
        sites = [s for s in module.all_bn_sites()
                 if s.api.framework in ("tensorflow", "keras") and not s.api.synced
                 and not s.opt_out and not s.shared_stats
                 and s.api.kind != "module" and reaches(s, in_loop(tower)) and training_mode(s)
                 and not frozen_in_inference(s, module)]
        if not sites:
            continue
        message = (
            f"BatchNorm built in every tower of this loop ({_lines(sites)}) normalizes each tower's "
            "slice of the batch with that slice's statistics only: the towers share variables but "
            "not batch statistics, so BN sees 1/N of the batch; synchronize the statistics across "
            "the towers"
        )
        origins = list(dict.fromkeys((s.origin.path, s.origin.span) for s in sites
                                     if s.origin is not None))
        related = tuple(Related(path, span, "a BatchNorm the towers build")
                        for path, span in origins[:2])
        yield Finding("BN006", tower.header or tower.span, message,
                      _tower_fix(module, tower, sites), related)


def _tower_fix(module: ModuleIR, tower: TowerLoop, sites: list[BNSite]) -> Fix:
    unsupported = [s for s in sites if s.api.synced_counterpart != SYNC_TOWERS]
    if unsupported:
        names = ", ".join(sorted({f"`{s.qualname}`" for s in unsupported}))
        how = "migrate it first, see BN007" if any(s.api.migration for s in unsupported) else \
            "all-reduce its batch mean and variance across the towers, or build it with " \
            "`tf.compat.v1.layers.batch_normalization`"
        return Fix(DISPLAY, f"Synchronize BN across towers ({names} has no cross-tower form "
                            f"in `{SYNC_TOWERS}`: {how})")
    statement = tower.statement
    if tower.count is None or statement is None or not statement.wrappable:
        return Fix(DISPLAY, f"Wrap the tower loop in `with {SYNC_TOWERS}(<number of towers>):`")
    name, imports = _import(module, SYNC_TOWERS)
    wrap = WrapStatements(statement.first_row, statement.last_row, f"with {name}({tower.count}):")
    return Fix(UNSAFE, f"Wrap the tower loop in `with {name}({tower.count}):` (adds a runtime "
                       f"dependency on bnfix; {COST})", (*imports, wrap))


# ---------------------------------------------------------------------------------------------
# Keras under a tf.distribute strategy scope


def _in_scope(scope: DeviceScope) -> Inside:
    def inside(function: FunctionInfo | None, row: int) -> bool:
        return function is scope.function and scope.first_row <= row <= scope.last_row
    return inside


def _strategy_scopes(module: ModuleIR) -> Iterator[Finding]:
    reported: set[int] = set()
    for scope in module.device_scopes:
        reached: dict[Span, list[BNSite]] = {}  # BN of other files, by the call made here
        for site in module.all_bn_sites():
            if id(site) in reported or "synchronized" not in site.api.defaults or \
                    site.api.synced or site.opt_out:
                continue
            if is_const(site.value("synchronized"), True) or site.weights_only or \
                    frozen_in_inference(site, module) or not reaches(site, _in_scope(scope)):
                continue
            reported.add(id(site))
            if site.origin is not None:
                reached.setdefault(site.span, []).append(site)
                continue
            yield Finding("BN006", site.span, _scope_message(f"`{site.call.callee}`", scope),
                          _keras_fix(module, site))
        for model in module.bn_models:
            if not model.keras or not _in_scope(scope)(model.function, model.span.start.row) \
                    or _frozen(module, model):
                continue
            built = f"`{model.callee}` (a Keras application: plain BatchNormalization layers)"
            fix = Fix(DISPLAY, "Synchronize its BN: `model = bnfix.keras.convert_sync(model)` "
                               f"rebuilds it with `synchronized=True` on each layer; {COST}")
            yield Finding("BN006", model.span, _scope_message(built, scope), fix)
        for span, sites in reached.items():
            first = sites[0]
            assert first.origin is not None
            more = f" and {len(sites) - 1} more" if len(sites) > 1 else ""
            built = f"`{first.qualname}` ({first.origin.describe()}){more}"
            fix = Fix(DISPLAY, f"{_sync_hint(module) or 'Pass `synchronized=True`'} where "
                               f"the layers are built "
                               f"({first.origin.describe()}{more}); {COST}")
            origins = dict.fromkeys((s.origin.path, s.origin.span) for s in sites
                                    if s.origin is not None)
            related = tuple(Related(path, where,
                                    "a BatchNormalization built without synchronized=True")
                            for path, where in list(origins)[:3])
            yield Finding("BN006", span, _scope_message(built, scope), fix, related)


def _frozen(module: ModuleIR, model: LibraryModel) -> bool:
    """`backbone.trainable = False`: a frozen Keras model runs its BN in inference mode."""
    return model.assigned is not None and any(
        a.attr == "trainable" and a.target == model.assigned and is_const(a.value, False)
        and a.function is model.function for a in module.attribute_sets)


def _scope_message(built: str, scope: DeviceScope) -> str:
    how = "" if scope.resolved else " (judged by its name)"
    return (
        f"{built} is built under `{scope.strategy}.scope()` (line {scope.span.start.row}), a "
        f"multi-device strategy{how}, without `synchronized=True`: each replica normalizes its "
        "own slice of the global batch and keeps its own moving statistics"
    )


def _sync_hint(module: ModuleIR) -> str | None:
    """What synchronizes a Keras BN where `synchronized=True` does not exist yet."""
    if module.tensorflow_target() < (2, 12):
        return ("Use `tf.keras.layers.experimental.SyncBatchNormalization` "
                "(`synchronized=True` needs TensorFlow 2.12)")
    return None


def _keras_fix(module: ModuleIR, site: BNSite) -> Fix:
    message = f"Pass `synchronized=True` ({COST})"
    hint = _sync_hint(module)
    if hint is not None:
        return Fix(DISPLAY, hint)
    arg = site.args.get("synchronized")
    if arg is not None:
        if is_const(arg.value, False):
            return Fix(UNSAFE, message, (Edit(arg.value_span, "True"),))
        return Fix(DISPLAY, message)
    if site.unpacked:
        return Fix(DISPLAY, message)
    call = site.call
    edit = Edit(Span.at(call.close_paren), "synchronized=True") if call.args_end is None else \
        Edit(Span.at(call.args_end), ", synchronized=True")
    return Fix(UNSAFE, message, (edit,))


# ---------------------------------------------------------------------------------------------
# torch DDP / Horovod

# A per-process batch from which each process's BN statistics are sound: ImageNet recipes
# train plain BN at 32 per GPU (Goyal et al. 2017), and BN's error grows as the batch falls
# below that (Wu & He 2018); detection and segmentation run 2-8 per GPU, where SyncBN pays
SOUND_BATCH = 32

MOVED = re.compile(r"^(?P<model>[A-Za-z_][\w.]*?)(?:\.(?:to|cuda)\(.*\))?$", re.DOTALL)


def _plain_torch_bn(module: ModuleIR) -> str | None:
    """Where this file gets plain BN from, for the message: its own BN layers, or a library
    model known to hold them; None when it has none (or already synchronizes some)."""
    torch_sites = [s for s in module.all_bn_sites() if s.api.framework == "torch"]
    if any(s.api.synced for s in torch_sites):
        return None
    plain = [s for s in torch_sites if not s.api.synced and s.api.synced_counterpart]
    local = [s for s in plain if s.origin is None]
    if local:
        return f"the BatchNorm layers of this file ({_lines(local)})"
    if plain:
        return f"the BatchNorm layers of the model it builds (`{plain[0].qualname}` at " \
               f"{plain[0].origin.describe()})"  # type: ignore[union-attr]
    torch_models = [m for m in module.bn_models if not m.keras]
    if torch_models:
        model = torch_models[0]
        return f"the BatchNorm layers of `{model.callee}` (line {model.span.start.row})"
    return None


def _replica_wraps(module: ModuleIR) -> Iterator[Finding]:
    if not module.trains and any(m.kind == "eval" for m in module.mode_calls):
        return  # an evaluation script: BN runs in eval mode, there are no batch statistics
    plain = _plain_torch_bn(module)
    if plain is None or any(s.kind == "sync_convert" for s in module.model_steps):
        return
    if module.loader_batch is not None and module.loader_batch >= SOUND_BATCH:
        return  # each process's batch is large enough for sound statistics: plain BN is the recipe
    for wrap in (s for s in module.model_steps if s.kind == "model_wrap" and s.replicas):
        if _converted_by_callers(wrap) or _bn_kept_in_eval(module, wrap) or \
                _handed_in(wrap) or _holds_no_bn(module, wrap):
            continue
        what = wrap.call.callee
        message = (
            f"`{what}` trains one replica per process, and {plain} stay plain: each process "
            "normalizes with its own batch only and keeps its own running statistics; convert "
            "them to SyncBatchNorm before the wrap"
        )
        yield Finding("BN006", wrap.call.span, message, _torch_fix(module, wrap))


def _handed_in(wrap: ModelStep) -> bool:
    """The wrapped model is a parameter of a function no code of the project calls
    (torchdistill's `wrap_if_distributed(student_model, ...)` in wrapper classes its registry
    builds): what it holds is not this file's BN."""
    match = MOVED.match(wrap.target)
    function = wrap.function
    return match is not None and function is not None and \
        match["model"] in function.params and not function.call_sites


def _holds_no_bn(module: ModuleIR, wrap: ModelStep) -> bool:
    """Every call that builds the wrapped model is known to build no BatchNorm: a torch
    layer or container with no BN inside (`wrap(nn.Linear(...))`, `nn.Sequential(nn.Conv2d(
    ...))`), or a class of this file none of whose methods builds one (torchdistill's
    `Regressor4VID`)."""
    if not wrap.builders:
        return False
    sites = module.all_bn_sites()
    return all(
        not any(built_by(s, b) for s in sites)
        and not any(b.span.start <= m.span.start and m.span.end <= b.span.end
                    for m in module.bn_models)
        and (b.local_class is not None or b.bn_free_library)
        for b in wrap.builders)


def _bn_kept_in_eval(module: ModuleIR, wrap: ModelStep) -> bool:
    """The function puts the BN modules in eval mode before the wrap (`for m in
    model.modules(): if isinstance(m, nn.BatchNorm2d): m.eval()`) and nothing of the file, nor
    of a file that calls the function, puts a model back in train mode: BN normalizes with its
    running statistics, there are no batch statistics to synchronize (suncet's fine-tuning)."""
    function = wrap.function
    if not any(m.kind == "eval" and m.bn_guarded and m.function is function
               and m.statement.first_row < wrap.statement.first_row for m in module.mode_calls):
        return False
    if any(m.kind == "train" for m in module.mode_calls):
        return False
    return not any(fact.startswith("train:") for site in
                   (function.call_sites if function is not None else ()) for fact in site.facts)


def _converted_by_callers(wrap: ModelStep) -> bool:
    """The wrap is of a model its function receives (`make_data_parallel(model, ...)`), and
    every caller in another file is in a module that converts BN to SyncBN, maybe under a flag
    (3D-ResNets: `if opt.batchnorm_sync: model = convert_sync_batchnorm(model)` in main.py,
    then `make_data_parallel(model, ...)`): the author chose, as with a conversion here."""
    function, match = wrap.function, MOVED.match(wrap.target)
    if function is None or match is None or match["model"] not in function.params:
        return False
    callers = [s for s in function.call_sites if s.where]
    return bool(callers) and all("sync_convert" in s.facts for s in callers)


def _torch_fix(module: ModuleIR, wrap: ModelStep) -> Fix:
    if wrap.qualname.startswith("horovod."):
        return Fix(DISPLAY, f"Use `horovod.torch.SyncBatchNorm` for the BN layers ({COST})")
    match = MOVED.match(wrap.target)
    if match is None:
        return Fix(DISPLAY, f"Convert the model's BN with `{TORCH_SYNC}` before the wrap")
    tests = telling_first(module.marks_of("bn_isinstance"), module.neighbours)
    if tests:
        return Fix(DISPLAY, f"Convert the model's BN with `{TORCH_SYNC}` before the wrap, once "
                            f"the project's `isinstance` tests of plain BN classes (for instance "
                            f"at {tests[0].where()}) also accept `torch.nn.SyncBatchNorm` (test "
                            "`torch.nn.modules.batchnorm._BatchNorm`): the converted layers no "
                            "longer pass them, so what they do (freeze, re-initialise, group) "
                            "would silently stop")
    model = match["model"]
    steps = [s for s in module.model_steps
             if s.function is wrap.function and s.kind in ("model_wrap", "optimizer")
             and s.statement.first_row <= wrap.statement.first_row
             and model in (s.target, s.assigned, MOVED.match(s.target) and
                           MOVED.match(s.target)["model"])]  # type: ignore[index]
    first = min(steps, key=lambda s: s.statement.first_row)
    if any(not s.statement.wrappable or s.statement.block != first.statement.block
           for s in steps):
        return Fix(DISPLAY, f"Convert the model's BN with `{TORCH_SYNC}` before the wrap and "
                            "before the optimizer")
    on_cpu = "gloo" in module.backends
    name, imports = _import(module, BNFIX_SYNC if on_cpu else TORCH_SYNC)
    why = (" (bnfix's SyncBatchNorm also runs on CPU/gloo, which this script uses; adds a runtime "
           "dependency on bnfix)" if on_cpu else " (torch's SyncBatchNorm trains on CUDA/NCCL "
           "only: on CPU/gloo it raises, where `bnfix.torch.convert_sync` works)")
    insert = InsertRows(first.statement.first_row, first.statement.indent,
                        ((0, f"{model} = {name}({model})"),))
    before = "the wrap and the optimizer" if any(s.kind == "optimizer" for s in steps) \
        else "the wrap"
    return Fix(UNSAFE, f"Convert BN to SyncBatchNorm before {before}{why}; {COST}",
               (*imports, insert))
