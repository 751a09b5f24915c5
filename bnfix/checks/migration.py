"""Migration rules: deprecated BN APIs and their replacements (BN007), and momentum written in
the other framework's convention (BN008)."""

from __future__ import annotations

from collections.abc import Iterator

from bnfix.checks import check
from bnfix.checks.tensorflow import hard_wired
from bnfix.findings import Applicability, Edit, Fix, Pos, Span
from bnfix.ir import (
    Arg,
    BNSite,
    Const,
    Finding,
    ModuleIR,
    Related,
    Unknown,
    Value,
    bindings,
    is_const,
    is_string,
)
from bnfix.rulebook import ApiRef, Migration

UNSAFE = Applicability.UNSAFE
DISPLAY = Applicability.DISPLAY_ONLY


# ---------------------------------------------------------------------------------------------
# BN007 deprecated-bn-api


def _literal_key(value: Value) -> str | None:
    """How a migration table names a literal value: the string itself, `True`/`None`/`0.9`,
    or the qualified name of a constant such as `tensorflow.GraphKeys.UPDATE_OPS`."""
    if isinstance(value, Const):
        return value.value if isinstance(value.value, str) else repr(value.value)
    if isinstance(value, Unknown):
        return value.qualname
    return None


class _Plan:
    """The edits that rewrite one call, and the reasons it cannot be rewritten exactly."""

    def __init__(self) -> None:
        self.edits: list[Edit] = []
        self.refusals: list[str] = []

    def refuse(self, reason: str) -> None:
        if reason not in self.refusals:
            self.refusals.append(reason)


def _plan(module: ModuleIR, site: BNSite, migration: Migration, target: str) -> _Plan:
    plan = _Plan()
    if site.unpacked:
        plan.refuse("arguments passed with * or ** cannot be mapped one by one")
    if site.api.id in module.arg_scoped:
        plan.refuse("an arg_scope in this module supplies arguments to this call: convert the "
                    "arg_scope too")
    scopes = module.marks_of(f"arg_scope:{site.api.id}", local=False)
    if scopes:
        plan.refuse(f"an arg_scope elsewhere in the project ({scopes[0].where()}) may supply "
                    "arguments to this call: convert it together with the arg_scope")
    callee = site.call.callee
    if "\n" in callee:
        plan.refuse("the callee spans several lines")
    start = site.call.span.start
    plan.edits.append(Edit(Span(start, Pos(start.row, start.col + len(callee))), target))
    shift = len(target) - len(callee)
    for row in site.call.aligned_rows:  # keep continuation rows lined up with the '('
        if shift > 0:
            plan.edits.append(Edit(Span.at(Pos(row, 0)), " " * shift))
        elif shift < 0:
            plan.edits.append(Edit(Span(Pos(row, 0), Pos(row, -shift)), ""))
    args = site.ordered_args()
    previous_end: Pos | None = None
    for index, arg in enumerate(args):
        _map_argument(plan, migration, arg, index, previous_end)
        previous_end = arg.span.end
    present = {a.name for a in args}
    extra = [f"{migration.rename.get(name, name)}={text}"
             for name, text in migration.defaults.items() if name not in present]
    extra += [item for item in migration.add if item.split("=", 1)[0] not in present]
    if extra:
        text = ", ".join(extra)
        if site.call.args_end is None:
            plan.edits.append(Edit(Span.at(site.call.close_paren), text))
        else:
            plan.edits.append(Edit(Span.at(site.call.args_end), ", " + text))
    return plan


def _map_argument(plan: _Plan, migration: Migration, arg: Arg, index: int,
                  previous_end: Pos | None) -> None:
    name = arg.name
    if not arg.keyword and index < migration.positional:
        return
    mapping = migration.values.get(name)
    if mapping is not None:
        key = _literal_key(arg.value)
        if key in mapping:
            replacement = mapping[key]
            if replacement:
                plan.edits.append(Edit(arg.span, replacement))
            elif previous_end is not None:
                plan.edits.append(Edit(Span(previous_end, arg.span.end), ""))
            else:
                plan.refuse(f"`{name}` cannot be dropped from the first position")
            return
    if name in migration.split:
        keys = migration.split[name]
        if arg.items is None or any(k not in keys for k, _ in arg.items):
            plan.refuse(migration.refuse.get(name, f"`{name}` is not a literal dict"))
            return
        parts = ", ".join(f"{keys[k]}={text}" for k, text in arg.items)  # type: ignore[index]
        if parts:
            plan.edits.append(Edit(arg.span, parts))
        elif previous_end is not None:
            plan.edits.append(Edit(Span(previous_end, arg.span.end), ""))
        return
    if name in migration.rename:
        new = migration.rename[name]
        if name in migration.require_str and not is_string(arg.value):
            plan.refuse(f"`{name}={arg.value_text}` is not known to be a string, and `{new}` "
                        "must be one")
            return
        if arg.keyword and arg.name_span is not None and new != name:
            plan.edits.append(Edit(arg.name_span, new))
        elif not arg.keyword:
            plan.edits.append(Edit(Span.at(arg.value_span.start), f"{new}="))
        return
    if migration.keep_unknown:
        return
    plan.refuse(migration.refuse.get(name, f"`{name}` has no equivalent"))


@check("BN007")
def deprecated_bn_api(module: ModuleIR) -> Iterator[Finding]:
    if module.dead:
        return  # nothing in the project runs this file: that it cannot run changes nothing
    tensorflow = module.tensorflow_target()
    version = ".".join(map(str, tensorflow))
    for mention in module.api_mentions:
        migration = mention.api.migration
        if migration is None or not _removed(migration, mention.written, tensorflow) or \
                _guarded(mention.alternatives, tensorflow):
            continue
        shown = module.spell(migration.to) or migration.to
        message = (f"`{mention.text}` does not exist in TensorFlow {version} (the version this "
                   f"code targets): {migration.why}; every use of it must change, not only its "
                   f"calls: use `{shown}`")
        yield Finding("BN007", mention.span, message,
                      Fix(DISPLAY, f"Name `{shown}` here, and map the arguments given to it "
                                   "elsewhere (its `normalizer_params`, the `arg_scope` "
                                   "defaults) to its argument names"))
    for site in module.bn_sites:
        migration = site.api.migration
        if migration is None or site.via_class is not None or \
                not _removed(migration, site.written, tensorflow) or \
                _guarded(site.alternatives, tensorflow):
            continue  # a subclass of a removed API: reported where its class names the base
        target = module.spell(migration.to)
        shown = target or migration.to
        message = (f"`{site.call.callee}` does not exist in TensorFlow {version} (the version "
                   f"this code targets): {migration.why}; use `{shown}`")
        if migration.display_only:
            yield Finding("BN007", site.call.span, message, Fix(DISPLAY, f"Use `{shown}`"))
            continue
        if site.indirect is not None:  # `normalizer_fn=slim.batch_norm`: called by the layer
            fix = Fix(DISPLAY, f"Build the BN with `{shown}` after the layer (its "
                               "`normalizer_params` map to other argument names)")
            yield Finding("BN007", site.call.span, message, fix)
            continue
        if target is None:
            fix = Fix(DISPLAY, f"Use `{shown}` (import its module first)")
            yield Finding("BN007", site.call.span, message, fix)
            continue
        plan = _plan(module, site, migration, target)
        if plan.refusals:
            message += " — not rewritten: " + "; ".join(plan.refusals)
            fix = Fix(DISPLAY, f"Use `{shown}` and map the remaining arguments by hand")
        else:
            fix = Fix(_applicability(site, migration), f"Use `{shown}` with the arguments mapped",
                      tuple(plan.edits))
        yield Finding("BN007", site.call.span, message, fix)


def _guarded(alternatives: tuple[tuple[str, ApiRef | None], ...],
             tensorflow: tuple[int, ...]) -> bool:
    """The name is imported under a version test, and one of its other targets exists on the
    targeted TensorFlow (the project's own copy, a maintained package, an API not removed):
    the code picks what runs there (tensornets: `if tf_later_than('2'): from .contrib_layers
    import batch_norm`, `else: from tensorflow.contrib.layers import batch_norm`)."""
    return any(api is None or api.migration is None or
               not _removed(api.migration, qualname, tensorflow)
               for qualname, api in alternatives)


def _removed(migration: Migration, written: str, tensorflow: tuple[int, ...]) -> bool:
    """Whether the API written so is gone from the targeted TensorFlow (a deprecated API
    that still runs there is not a bug)."""
    # tf.compat.v1.X names what tf.X named in TF 1.x
    written = written.replace("tensorflow.compat.v1.", "tensorflow.", 1)
    if migration.written and not written.startswith(migration.written):
        return False
    return bool(migration.removed) and tensorflow >= migration.removed


def _applicability(site: BNSite, migration: Migration) -> Applicability:
    """Safe when the migration is exact for this call (it passes every `safe_when` keyword,
    not as None), else unsafe: see BN007's Fix safety."""
    if not migration.safe_when:
        return UNSAFE
    passed = {arg.name for arg in site.args.values()
              if arg.keyword and _literal_key(arg.value) != "None"}
    return Applicability.SAFE if set(migration.safe_when) <= passed else UNSAFE


# ---------------------------------------------------------------------------------------------
# BN008 momentum-convention

# Momenta strictly between this and 1 - this are plausible in both conventions: not reported
AMBIGUOUS = 0.2

TORCH_MESSAGE = (
    "`{callee}({name}={text})`: PyTorch's momentum is the weight of the new batch "
    "(running = (1 - m) * running + m * batch, default 0.1); {value:g} is TensorFlow's convention, "
    "so the running statistics follow each batch almost entirely. Use {name}=1 - {text}"
)
TF_MESSAGE = (
    "`{callee}({name}={text})`: TensorFlow/Keras momentum is the decay of the old value "
    "(moving = m * moving + (1 - m) * batch, default 0.99); {value:g} is PyTorch's convention, "
    "so the moving statistics are mostly the last batch. Use {name}=1 - {text}"
)


@check("BN008")
def momentum_convention(module: ModuleIR) -> Iterator[Finding]:
    seen: set[Span | None] = set()
    for site in module.all_bn_sites():
        if hard_wired(site) or is_const(site.value("track_running_stats"), False):
            continue  # the moving statistics are never used (or kept): momentum does not matter
        convention = site.api.momentum_convention
        if convention not in ("tf", "torch"):
            continue
        arg = site.args.get("momentum")
        if arg is not None and isinstance(arg.value, Const):  # one finding per call
            momenta = [arg.value] if arg.span not in seen else []
            seen.add(arg.span)
        else:
            momenta = _momenta(site)
        for literal in momenta:
            value = literal.value
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 < value < 1 or literal.span is None:
                continue
            # the other convention's values are far from 0.5 (0.9-0.999 against 0.1-0.001);
            # a value near it reads as meant in either (Tensorflow-Tutorial's deliberate
            # `momentum=0.4`, "the default 0.99 is too high in this case")
            if convention == "torch" and value >= 1 - AMBIGUOUS:
                template = TORCH_MESSAGE
            elif convention == "tf" and value <= AMBIGUOUS:
                template = TF_MESSAGE
            else:
                continue
            if arg is None or not isinstance(arg.value, Const):
                if literal.span in seen:
                    continue
                seen.add(literal.span)
            yield _bn008(site, literal, template, convention)
        if convention == "torch" and site.origin is None:
            yield from _momentum_as_eps(site)


# A literal epsilon at least this large, given in eps's position, is a momentum written where
# PyTorch takes eps (`nn.BatchNorm2d(128, 0.8)`: 0.8 added to every variance)
EPS_AS_MOMENTUM = 0.05


def _momentum_as_eps(site: BNSite) -> Iterator[Finding]:
    arg = site.args.get("epsilon")
    if arg is None or arg.keyword or not isinstance(arg.value, Const):
        return
    value = arg.value.value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not EPS_AS_MOMENTUM <= value < 1:
        return
    message = (
        f"`{site.call.callee}(..., {arg.value_text})`: the second positional parameter of "
        f"PyTorch's BatchNorm is `eps`, not momentum: {value:g} is added to every variance, "
        "which flattens the normalization (eps defaults to 1e-5); a momentum was meant "
        f"(Keras' `momentum={value:g}` is PyTorch's `momentum={1 - value:g}`)"
    )
    fix = Fix(DISPLAY, f"Pass the momentum by keyword, in PyTorch's convention "
                       f"(`momentum=1 - {arg.value_text}` for a Keras momentum), and leave eps "
                       "at its default")
    yield Finding("BN008", arg.span, message, fix)


def _momenta(site: BNSite) -> list[Const]:
    """The literal momenta that reach the BN and are written in this file: at the call, or
    through a wrapper's parameter (its default, or what a call site here passes)."""
    arg = site.args.get("momentum")
    value = arg.value if arg is not None else site.bound.get("momentum")
    out = []
    for binding in bindings(site.function):
        bound = binding.value(value)
        if isinstance(bound, Const) and bound.local and bound not in out:
            out.append(bound)
    return out


def _bn008(site: BNSite, literal: Const, template: str, convention: str) -> Finding:
    arg = site.args.get("momentum")
    direct = arg is not None and isinstance(arg.value, Const)  # written at the call (or its name)
    name = arg.name if arg is not None else "momentum"
    text = arg.value_text if direct and arg is not None else literal.text
    operand = text if _atomic(text) else f"({text})"
    callee = site.call.callee if site.origin is None else site.qualname
    message = template.format(callee=callee, name=name, text=operand, value=literal.value)
    if not direct:
        where = f" (built at {site.origin.describe()})" if site.origin is not None else ""
        message = f"the momentum written here reaches `{callee}`{where}: " + message
    assert literal.span is not None
    where = arg.value_span if direct and arg is not None else literal.span
    fix = Fix(UNSAFE, f"Convert to the {'PyTorch' if convention == 'torch' else 'TensorFlow'} "
              f"convention: `{name}=1 - {operand}`", (Edit(where, f"1 - {operand}"),))
    span = arg.span if direct and arg is not None else literal.span
    related = () if site.origin is None else (
        Related(site.origin.path, site.origin.span, "the BatchNorm is built here"),)
    return Finding("BN008", span, message, fix, related)


def _atomic(text: str) -> bool:
    return text.replace(".", "").replace("_", "").replace("e-", "").isalnum()
