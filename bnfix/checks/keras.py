"""Keras rules: trainable=False means inference mode (BN009), a Keras 3 BN in TF1 graph mode
never updates its moving statistics (BN011), and a model called without `training=True` in a
custom training step runs its BN in inference mode (BN012)."""

from __future__ import annotations

from collections.abc import Iterator

from bnfix.checks import check
from bnfix.findings import Applicability, Edit, Fix, Span
from bnfix.ir import (
    BNSite,
    Builder,
    Const,
    Finding,
    ModuleIR,
    Related,
    TapeCall,
    Value,
    bindings,
    is_const,
)

KERAS3_TENSORFLOW = (2, 16)  # tf.keras is Keras 3 from TensorFlow 2.16 on


def _tensorflow(module: ModuleIR) -> tuple[int, ...]:
    return module.tensorflow_target()


BN009_MESSAGE = (
    "{what}: since TF 2.0 a Keras BatchNormalization with trainable=False also runs in inference "
    "mode (normalizes with its moving statistics and never updates them). If this freezes BN for "
    "fine-tuning, that is what happens (say so with `# noqa: BN009`); if it ports PyTorch's "
    "`affine=False` (no learnable scale/offset), use `center=False, scale=False` instead"
)


@check("BN009")
def keras_trainable_false_is_inference(module: ModuleIR) -> Iterator[Finding]:
    if _tensorflow(module) < (2, 0) or module.has_mark("loads_weights"):
        return  # TF1 semantics; or trained weights are loaded: the fine-tuning freeze
    for site in module.all_bn_sites():
        if site.api.trainable_semantics != "inference":
            continue
        literal = _frozen_by(site)
        if literal is None or literal.where is not None or literal.span is None:
            continue  # not frozen, or frozen by a `False` written in another file (reported there)
        arg = site.args.get("trainable")
        if arg is not None and arg.value.span == literal.span:
            what = f"`{site.call.callee}(trainable=False)`"
            fix = Fix(Applicability.DISPLAY_ONLY,
                      "For a port of `affine=False`: `center=False, scale=False`",
                      (Edit(arg.span, "center=False, scale=False"),))
            yield Finding("BN009", arg.span, BN009_MESSAGE.format(what=what), fix)
            continue
        built = f"`{site.call.callee}`" if site.origin is None else \
            f"`{site.qualname}` ({site.origin.describe()})"
        what = f"{built} gets `trainable=False` from line {literal.span.start.row}"
        fix = Fix(Applicability.DISPLAY_ONLY,
                  "For a port of `affine=False`: build the layer with `center=False, scale=False`")
        related = () if site.origin is None else (
            Related(site.origin.path, site.origin.span, "the BatchNormalization is built here"),)
        yield Finding("BN009", literal.span, BN009_MESSAGE.format(what=what), fix, related)
    for assignment in module.attribute_sets:
        if assignment.attr != "trainable" or not is_const(assignment.value, False):
            continue
        site: BNSite | None = assignment.site
        api = site.api if site is not None else assignment.guard
        if api is None or api.trainable_semantics != "inference":
            continue
        what = f"`{assignment.target}.trainable = False` on a BatchNormalization layer"
        fix = Fix(Applicability.DISPLAY_ONLY,
                  "For a port of `affine=False`: build the layer with `center=False, scale=False`")
        yield Finding("BN009", assignment.span, BN009_MESSAGE.format(what=what), fix)


def _trainable_values(site: BNSite) -> Iterator[Value | None]:
    """What the layer's `trainable` is in each calling context."""
    value = site.value("trainable")
    return (binding.value(value) for binding in bindings(site.function))


def _frozen_by(site: BNSite) -> Const | None:
    """The literal `False` that reaches the layer's `trainable` in some calling context."""
    return next((v for v in _trainable_values(site)
                 if isinstance(v, Const) and is_const(v, False)), None)


def frozen_in_inference(site: BNSite, module: ModuleIR) -> bool:
    """A Keras BN built with `trainable=False` in every calling context (TF 2): it runs in
    inference mode whatever `training` says, normalizing with its fixed moving statistics
    (faster-rcnn-tf2's frozen ResNet backbone), so it needs no synchronization (BN006) and
    cancels no bias (BN104)."""
    if site.api.trainable_semantics != "inference" or _tensorflow(module) < (2, 0):
        return False
    return all(is_const(v, False) for v in _trainable_values(site))


def _keras3(site: BNSite, module: ModuleIR) -> bool:
    """The site builds a Keras 3 layer: tf.keras or keras on TF >= 2.16, unless tf-keras is
    selected (TF_USE_LEGACY_KERAS) or the layer comes from tf_keras itself."""
    if site.api.framework != "keras" or site.api.updates != "layer":
        return False
    if site.qualname.startswith("tf_keras.") or site.written.startswith("tf_keras."):
        return False
    return _tensorflow(module) >= KERAS3_TENSORFLOW and not module.legacy_keras


def _switched_by_callers(module: ModuleIR, depth: int = 3) -> bool:
    """Whether a module that calls this one's functions (up to `depth` calls away, in other
    files) switches TensorFlow to graph mode: the entry script usually does, then calls in."""
    frontier = [f for f in module.functions if f.call_sites]
    for _ in range(depth):
        following = []
        for function in frontier:
            for site in function.call_sites:
                if site.where and "graph_switch" in site.facts:
                    return True
                if site.caller is not None:
                    following.append(site.caller)
        frontier = following
    return False


@check("BN011")
def keras3_bn_in_graph_mode(module: ModuleIR) -> Iterator[Finding]:
    if not module.graph_mode or module.removed_by_keras3 is not None and \
            module.tensorflow_target() >= (2, 16):
        return  # `tf.estimator` & co. are gone from the TF whose tf.keras is Keras 3: no such run
    switches = [m for m in module.graph_mode if m.kind == "graph_switch"]
    if not switches and not _switched_by_callers(module):
        return  # Session/placeholder and no switch where it runs: TF1-only code (eager on TF 2)
    marker = (switches or module.graph_mode)[0]
    calls: set[Span] = set()
    for site in module.all_bn_sites():
        if not _keras3(site, module) or (site.origin is not None and site.span in calls):
            continue  # one finding per call that reaches Keras BN in another file
        calls.add(site.span)
        built = f"`{site.call.callee}`" if site.origin is None else \
            f"`{site.qualname}` ({site.origin.describe()})"
        message = (
            f"Keras 3 {built} in TF1 graph-mode code (`{marker.text}` at line "
            f"{marker.span.start.row}): Keras 3 does not train in graph mode (its `fit` raises "
            "there), and in a train op a session runs the layer adds no update ops to "
            "UPDATE_OPS, so its moving mean/variance never change and inference uses their "
            "initial values; use `tf.compat.v1.layers.batch_normalization` with tf-keras "
            "(`pip install tf-keras`, TF_USE_LEGACY_KERAS=1), or run the model eagerly"
        )
        fix = Fix(Applicability.DISPLAY_ONLY,
                  "Run TF1 graph code with tf-keras (TF_USE_LEGACY_KERAS=1)")
        related = () if site.origin is None else (
            Related(site.origin.path, site.origin.span, "the Keras layer is built here"),)
        yield Finding("BN011", site.call.span, message, fix, related)


# ---------------------------------------------------------------------------------------------
# BN012 keras-bn-inference-in-training-step


@check("BN012")
def keras_bn_inference_in_training_step(module: ModuleIR) -> Iterator[Finding]:
    if _tensorflow(module) < (2, 0) or module.has_mark("learning_phase"):
        return  # TF1 Keras follows the learning phase; so does tf.keras 2 once it is set
    for tape in module.tape_calls:
        if tape.training_default or any(b.span in module.training_models for b in tape.builders):
            continue  # the model's class defaults `call`'s `training` to True
        if tape.positional > 1 and not _positional_not_training(module, tape):
            continue  # `model(x, True)`: the second argument may be `training`
        sites = _sites_held(module, tape)
        held = _bn_held(module, tape, sites)
        if not held:
            continue
        call = tape.call
        message = (
            f"`{tape.receiver}(...)` runs the model without `training=True` inside the "
            f"GradientTape of a training step (it applies gradients on line {tape.train_row}): "
            f"its BatchNormalization layers ({held}) run in inference mode: they normalize with "
            "their moving mean and variance, which never update (they stay at 0 and 1), so BN "
            "does not normalize at all and the model trains without it"
        )
        edit = Edit(Span.at(call.args_end), ", training=True") if call.args_end else None
        fix = Fix(Applicability.UNSAFE, "Pass `training=True`", (edit,)) if edit else \
            Fix(Applicability.DISPLAY_ONLY, "Pass `training=True`")
        related = tuple(Related(s.origin.path, s.origin.span, "a BatchNormalization of the model")
                        for s in [s for s in sites if s.origin is not None][:1])  # type: ignore[union-attr]
        yield Finding("BN012", call.span, message, fix, related)


def _positional_not_training(module: ModuleIR, tape: TapeCall) -> bool:
    """The arguments a call passes by position all land in parameters of the model class's
    `call` other than `training` (`model(images, labels)` for `call(self, x, y)`): a Keras
    model's `__call__` hands them on to `call` in order. Unknown for any other model (a
    functional model's `call` takes `training` second)."""
    signatures = {tape.signature} if tape.signature is not None else {
        module.call_signatures[b.span] for b in tape.builders if b.span in module.call_signatures}
    if len(signatures) != 1:
        return False
    (names,) = signatures
    return len(names) >= tape.positional and "training" not in names[:tape.positional]


def _keras_bn(site: BNSite) -> bool:
    """A Keras BatchNormalization layer that trains: its `training` comes at call time."""
    return site.api.framework == "keras" and site.api.kind == "layer" and \
        not is_const(site.value("trainable"), False)


def _sites_held(module: ModuleIR, tape: TapeCall) -> list[BNSite]:
    return [s for s in module.all_bn_sites() if _keras_bn(s) and (
        tape.owner is not None and s.function is not None and s.function.class_name == tape.owner
        or any(built_by(s, b) for b in tape.builders))]


def built_by(site: BNSite, builder: Builder) -> bool:
    """The BN is built when `builder` runs: reached through it (another file), inside it (a
    `Sequential([...])` literal), applied before a functional `Model(...)` in its function, built
    by its class, or built by a function of this file that it calls."""
    if site.origin is not None:
        return site.call.span == builder.span
    if builder.span.start <= site.span.start and site.span.end <= builder.span.end:
        return True
    function = site.function
    if builder.since is not None and function is builder.function and \
            builder.since <= site.span.start < builder.span.start:
        return True
    if builder.local_class is not None and function is not None and \
            function.class_name == builder.local_class:
        return True
    return any(s.span == builder.span for b in bindings(function) for _, s in b.chain)


def _bn_held(module: ModuleIR, tape: TapeCall, sites: list[BNSite]) -> str:
    if sites:
        first = sites[0]
        where = f"line {first.span.start.row}" if first.origin is None else first.origin.describe()
        more = f" and {len(sites) - 1} more" if len(sites) > 1 else ""
        return f"`{first.qualname}` at {where}{more}"
    models = [m for m in module.bn_models if m.keras and any(
        m.span == b.span for b in tape.builders)]
    return f"those of `{models[0].callee}`" if models else ""

