"""Keras rules: trainable=False means inference mode (BN009), and a Keras 3 BN in TF1 graph
mode never updates its moving statistics (BN011)."""

from __future__ import annotations

from collections.abc import Iterator

from bnfix.checks import check
from bnfix.findings import Applicability, Edit, Fix, Span
from bnfix.ir import BNSite, Const, Finding, ModuleIR, Related, bindings, is_const

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
    if _tensorflow(module) < (2, 0):
        return
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


def _frozen_by(site: BNSite) -> Const | None:
    """The literal `False` that reaches the layer's `trainable` in some calling context."""
    value = site.value("trainable")
    for binding in bindings(site.function):
        bound = binding.value(value)
        if isinstance(bound, Const) and is_const(bound, False):
            return bound
    return None


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
            f"{marker.span.start.row}): the layer builds, but adds no update ops to UPDATE_OPS, "
            "so its moving mean/variance never change and inference uses their initial values; "
            "use `tf.compat.v1.layers.batch_normalization` with tf-keras (`pip install tf-keras`, "
            "TF_USE_LEGACY_KERAS=1), or run the model eagerly"
        )
        fix = Fix(Applicability.DISPLAY_ONLY,
                  "Run TF1 graph code with tf-keras (TF_USE_LEGACY_KERAS=1)")
        related = () if site.origin is None else (
            Related(site.origin.path, site.origin.span, "the Keras layer is built here"),)
        yield Finding("BN011", site.call.span, message, fix, related)
