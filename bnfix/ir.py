"""The intermediate representation: BN sites and their context, and the findings rules make of
them (their fixes and positions are in `findings.py`, shared with the cache and the reports).

Front-ends (Python source today; modules, graphs and artifacts later) lift their input into
these records; rules read only these records; writers lower the edits back. Nothing here
knows how the records were produced.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from bnfix.findings import Fix, Pos, Span, shown_path

if TYPE_CHECKING:
    from bnfix.rulebook import ApiRef

# ---------------------------------------------------------------------------------------------
# Values: what static analysis knows about an argument


class Const(NamedTuple):
    """A literal (after following module constants and single local assignments). `where` is
    the file `span` is in when that is not the module being checked (a wrapper's default in
    another file of the project)."""

    value: object
    text: str
    span: Span | None
    where: str | None = None
    negated: bool = False  # the literal written at `span` is `not value` (reached through `not p`)

    @property
    def local(self) -> bool:
        """Written in the module being checked (so a fix can edit it)."""
        return self.where is None and self.span is not None


class Unknown(NamedTuple):
    """An expression whose value static analysis cannot know (`self.is_training`, a tensor)."""

    text: str
    span: Span | None
    qualname: str | None = None  # a dotted name resolved through imports (`tf.GraphKeys.X`)
    type: str | None = None  # what the expression is known to be: "str" for formatting
    where: str | None = None  # the file `span` is in, when not the module being checked


class FromParam(NamedTuple):
    """The value of parameter `name` of `function`: resolved at each of its call sites."""

    function: FunctionInfo
    name: str
    span: Span | None
    negated: bool = False  # `not <param>`: the parameter's truth value inverted


Value = Const | Unknown | FromParam


def negate(value: Value) -> Value:
    """`not value`: a literal folded, a parameter marked, anything else unknown."""
    if isinstance(value, Const):
        return Const(not value.value, value.text, value.span, value.where, not value.negated)
    if isinstance(value, FromParam):
        return FromParam(value.function, value.name, value.span, not value.negated)
    return Unknown(f"not ({value.text})", value.span, where=value.where)


class Param(NamedTuple):
    name: str
    default: Value | None
    default_span: Span | None
    positional: bool  # may be passed by position
    index: int


@dataclass
class CallSite:
    """A call of a function: what it passes for each parameter. A call made in another file
    of the project has `where` set (its spans are in that file: never edited from here) and
    `tags` saying where it sits there (`tower`, `strategy`, `no_grad`)."""

    span: Span
    args: dict[str, Value]
    call: CallInfo
    caller: FunctionInfo | None
    where: str | None = None
    tags: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()  # the calling module's facts (`train:model`), when elsewhere


@dataclass(eq=False)
class FunctionInfo:
    """A function or method defined in the module, with the call sites found in the module."""

    qualname: str
    name: str
    class_name: str | None
    span: Span
    params: dict[str, Param]
    call_sites: list[CallSite] = field(default_factory=list)
    training_flag: str | None = None  # a parameter that carries the train/eval switch
    body: Block | None = None  # its statements after the docstring (None for one-liners)
    callers_eval: frozenset[str] = frozenset()  # params every caller put in eval mode first
    where: str | None = None  # the file it is defined in, when not the module being checked

    def param_value(self, site: CallSite, name: str) -> Value | None:
        """What `site` binds to parameter `name`: the passed value or the default."""
        if name in site.args:
            return site.args[name]
        param = self.params.get(name)
        return param.default if param else None


class CallInfo(NamedTuple):
    """Where a call's pieces are, for edits: its span, its callee text and argument anchors."""

    span: Span
    callee: str
    args_end: Pos | None  # end of the last argument, None when there are no arguments
    close_paren: Pos  # the position of ')'
    trailing_comma: bool
    multiline: bool
    aligned_rows: tuple[int, ...] = ()  # continuation rows aligned with the '(' (visual indent)


class Binding:
    """One calling context of a site: a chain of call sites from its function outwards.

    `value()` evaluates a Value in that context: a parameter becomes what the call site passes
    (or the default), recursively up the chain."""

    def __init__(self, chain: tuple[tuple[FunctionInfo, CallSite], ...] = ()) -> None:
        self.chain = chain

    def value(self, value: Value | None, defaults: bool = True) -> Value | None:
        """With `defaults` False, a parameter of a function no call reaches stays itself. A
        parameter of a function further out in the chain (`__init__`'s, for the `_make_layer`
        it calls) is taken where that function is called."""
        chain = self.chain
        if isinstance(value, FromParam):
            outer = next((i for i, (f, _) in enumerate(chain) if f is value.function), 0)
            chain = chain[outer:]
        for function, site in chain:
            if not (isinstance(value, FromParam) and value.function is function):
                break
            negated = value.negated
            value = function.param_value(site, value.name)
            if negated and value is not None:
                value = negate(value)
        if defaults and isinstance(value, FromParam) and not value.function.call_sites:
            param = value.function.params.get(value.name)
            if param is not None and param.default is not None:
                return negate(param.default) if value.negated else param.default
        return value

    @property
    def innermost_site(self) -> CallSite | None:
        return self.chain[0][1] if self.chain else None


def bindings(function: FunctionInfo | None, depth: int = 3, limit: int = 64) -> Iterator[Binding]:
    """Every calling context of code in `function`, up to `depth` call levels and `limit`
    contexts; a function with no known call site yields the empty context."""
    if function is None or not function.call_sites or depth == 0:
        yield Binding()
        return
    produced = 0
    for site in function.call_sites:
        for outer in bindings(site.caller, depth - 1, limit):
            yield Binding(((function, site),) + outer.chain)
            produced += 1
            if produced >= limit:
                return


def is_string(value: Value | None, depth: int = 3) -> bool:
    """A string in every calling context: a literal, a formatted string, or a parameter that
    every call site passes a string."""
    if isinstance(value, Const):
        return isinstance(value.value, str)
    if isinstance(value, Unknown):
        return value.type == "str"
    if isinstance(value, FromParam) and depth > 0:
        contexts = list(bindings(value.function, depth=1))
        return all(is_string(b.value(value), depth - 1) for b in contexts) and any(
            b.chain or value.function.params[value.name].default is not None for b in contexts)
    return False


def is_const(value: Value | None, expected: object) -> bool:
    """True when `value` is the literal `expected` (True is not 1 here)."""
    return (
        isinstance(value, Const)
        and type(value.value) is type(expected)
        and value.value == expected
    )


# ---------------------------------------------------------------------------------------------
# BN sites


class Arg(NamedTuple):
    """An argument as written at a BN call: its name in that API, value and spans."""

    name: str
    value: Value
    span: Span  # the whole argument (`trainable=False`)
    keyword: bool
    value_span: Span  # the value expression as written at the call
    value_text: str  # its source text
    items: tuple[tuple[object, str], ...] | None = None  # a dict literal: (key, value text)

    @property
    def name_span(self) -> Span | None:
        """Where the keyword's name is written (`trainable` in `trainable=False`)."""
        if not self.keyword:
            return None
        start = self.span.start
        return Span(start, Pos(start.row, start.col + len(self.name)))


@dataclass
class LayerCall:
    """A call of a BN layer object (`bn(x, training=True)`): where call-time arguments live."""

    args: dict[str, Arg]
    function: FunctionInfo | None
    call: CallInfo


class Origin(NamedTuple):
    """Where a BN reached through first-party calls is built: its file and span, and the calls
    that lead there from the module being checked (file, span, callee)."""

    path: str
    span: Span
    via: tuple[tuple[str, Span, str], ...] = ()

    def describe(self) -> str:
        """`models/layers.py:12, reached through `Net` -> `conv_bn``"""
        chain = " -> ".join(f"`{callee.rsplit('.', 1)[-1]}`" for _, _, callee in self.via)
        return f"{shown_path(self.path)}:{self.span.start.row}" + (
            f", reached through {chain}" if chain else "")


@dataclass
class BNSite:
    """One BatchNorm construction or call, resolved against the API catalogue.

    A site with an `origin` is built in another file of the project and reached from this
    module through a first-party call: `call` is that call here, `function` the function
    making it, `bound` the BN's arguments as that call determines them, and `settable` the
    parameter of the called function through which a BN argument could be passed."""

    api: ApiRef
    qualname: str
    call: CallInfo
    args: dict[str, Arg]  # by canonical parameter name
    function: FunctionInfo | None
    instance_calls: list[LayerCall] = field(default_factory=list)
    unpacked: bool = False  # *args / **kwargs at the call: more arguments than are known
    written: str = ""  # the qualified name as imported (`tensorflow.contrib.slim.batch_norm`)
    origin: Origin | None = None
    bound: dict[str, Value] = field(default_factory=dict)
    settable: dict[str, str] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()  # the `if` tests the BN call runs under
    indirect: str | None = None  # "normalizer_fn": another layer calls it (slim's idiom)
    opt_out: bool = False  # the other branch of its `if` builds a synchronized BN instead
    # the model built by the call here is only used to give its weights away (`load_weights`,
    # `get_layer(...).get_weights()`): it never trains
    weights_only: bool = False
    # built through a BN subclass of the project that only re-routes arguments (its name):
    # the rules read it as the BN it extends; a fix must not rewrite its callee
    via_class: str | None = None
    # what else its callee may be: the other targets of a name imported under a version test,
    # with their catalogue entry (None: the project's own code, or not a BN API)
    alternatives: tuple[tuple[str, ApiRef | None], ...] = ()
    # a BN given its statistics (`tf.nn.batch_normalization(x, mean, var, ...)`) that are not
    # its own batch's moments: computed before the loop that builds each tower (shared by all),
    # or read from variables (the moving averages, in inference)
    shared_stats: bool = False

    def ordered_args(self) -> list[Arg]:
        """The arguments in source order."""
        return sorted(self.args.values(), key=lambda a: a.span.start)

    @property
    def span(self) -> Span:
        return self.call.span

    def value(self, canonical: str) -> Value | None:
        """The argument's value, or the catalogue default when it is not passed."""
        arg = self.args.get(canonical)
        if arg is not None:
            return arg.value
        if canonical in self.bound:
            return self.bound[canonical]
        if canonical in self.api.defaults:
            default = self.api.defaults[canonical]
            return Const(default, repr(default), None)
        return None


# ---------------------------------------------------------------------------------------------
# Context: TF1 multi-tower training, collections, train ops, EMA


class WithItem(NamedTuple):
    """One `with` item: the call, where ` as name` would go, and the bound name if any."""

    qualname: str
    span: Span
    as_name: str | None
    item_end: Pos
    arg_text: str


class Block(NamedTuple):
    """A compound statement's body: rows and whether each row can be re-indented as a whole."""

    header_row: int
    first_row: int
    last_row: int
    indent: str


@dataclass
class TowerLoop:
    """A `for` loop that builds one model replica per device with shared variables."""

    span: Span
    function: FunctionInfo | None
    loop_var: str | None
    starts_at_zero: bool
    reuse: bool
    name_scope: WithItem | None
    device_block: Block | None
    device_item: WithItem | None
    body_last_row: int
    header: Span | None = None  # `for i in range(n)` up to the colon
    count: str | None = None  # the tower count as written (`n` of `range(n)`)
    statement: Statement | None = None  # the whole loop, for a fix that wraps it
    synced: bool = False  # built inside `with bnfix.tf1.sync_towers(...)`


class VarsTerm(NamedTuple):
    """A piece of a variable-list expression and which variable families it holds."""

    span: Span
    text: str
    tags: frozenset[str]


class VarsExpr(NamedTuple):
    """A variable-list expression (`tf.trainable_variables() + tf.moving_average_variables()`),
    traced through local assignments, split into `+` terms."""

    span: Span
    text: str
    terms: tuple[VarsTerm, ...]
    defined_at: Span | None  # where a traced local variable got this value
    local_name: str | None
    local_uses: int

    @property
    def tags(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for term in self.terms:
            out |= term.tags
        return out


@dataclass
class CollectionGet:
    """`tf.get_collection(KEY[, scope])`."""

    key: str
    scoped: bool
    call: CallInfo
    function: FunctionInfo | None
    tower: TowerLoop | None
    inside_tower: bool  # lexically inside the tower loop (else after it)
    usage: str  # assign | accumulate | other
    row_in_loop_after_scope: bool  # inside the loop, after the tower's name scope was entered
    tower_always: bool = True  # after the loop: the loop runs on every path that reaches it


class Statement(NamedTuple):
    span: Span
    first_row: int
    last_row: int
    wrappable: bool  # starts and ends its own rows, not part of a one-line compound statement
    indent: str = ""  # the indentation of its first row
    block: int = 0  # identifies the statement list (body) it belongs to


@dataclass
class TrainOp:
    """A train-op construction: `opt.minimize`, `opt.apply_gradients`, `create_train_op` …"""

    kind: str
    call: CallInfo
    statement: Statement
    function: FunctionInfo | None
    control_keys: frozenset[str]  # collection keys reaching enclosing control_dependencies
    under_control_deps: bool
    adds_update_ops: bool  # a helper that runs UPDATE_OPS itself, or grouped with them later
    after_tower: TowerLoop | None
    conditions: tuple[Condition, ...] = ()  # the `if` tests it is built under


@dataclass
class EmaApply:
    """`ema.apply(var_list)` where `ema` is a `tf.train.ExponentialMovingAverage`."""

    call: CallInfo
    var_list: VarsExpr | None
    function: FunctionInfo | None


@dataclass
class GradientSum:
    """`tf.add_n(...)` / `tf.reduce_sum(..., 0)` over the per-tower entries of `zip(*tower_grads)`."""

    kind: str  # add_n | reduce_sum
    call: CallInfo
    function: FunctionInfo | None
    loop_var: str | None  # the per-variable tuple of tower gradients (`grad_and_vars`)
    divided: bool  # divided (or multiplied by a reciprocal) afterwards
    nested: bool  # an operand of a larger expression (a fix must parenthesize)


@dataclass
class AttributeSet:
    """`bn.trainable = False`: the object is a traced BN site, or a name narrowed to a BN class
    by an enclosing `isinstance(...)` check."""

    attr: str
    value: Value
    span: Span
    target: str
    site: BNSite | None
    guard: ApiRef | None
    function: FunctionInfo | None


class Region(NamedTuple):
    """Code that runs a model for evaluation: a `with torch.no_grad()` / `inference_mode()`
    block, or a function decorated with them."""

    kind: str  # with | function
    span: Span
    body: Block | None  # the rows a fix may wrap
    # the first row of the statement right before the `with` in its block (None: none, or a
    # decorated function): `model.train()` there puts the model in train mode on purpose
    previous_row: int | None = None


@dataclass
class ModelCall:
    """A call through a plain name or attribute (`model(x)`, `self.net(x)`), which is how
    PyTorch code runs a module."""

    target: str  # `model`, `self.net`
    span: Span
    function: FunctionInfo | None
    region: Region | None
    iterates: str = ""  # the iterables of the loops around the call and in its no_grad block
    bound_row: int | None = None  # last row that binds the model's name in its function first


class TrainingCall(NamedTuple):
    """A call of a model or layer object (`model(x, training=True)`, `self.net(...)`) with a
    literal `training=True`."""

    target: str  # as written: `model`, `self.net`
    arg: Arg  # the `training=True` keyword
    function: FunctionInfo | None


@dataclass
class ModeCall:
    """`x.eval()`, `x.train()`, `x.train(False)`."""

    kind: str  # eval | train
    target: str
    span: Span
    statement: Statement
    function: FunctionInfo | None
    bn_guarded: bool  # `x` is narrowed to a BatchNorm by an enclosing isinstance()/name check
    # the function may run `x` after this call (it names `x` later, or the call is in a loop);
    # False for a local or parameter this is the last word on: train mode goes to the callers
    used_after: bool = True


@dataclass
class FreezeCall:
    """An application of a BN freeze: `model.freeze_bn()`, `model.apply(set_bn_eval)`,
    `freeze_bn(model)`."""

    target: str
    text: str  # how to apply it again to `target`
    span: Span
    statement: Statement
    function: FunctionInfo | None
    condition: str | None  # the test of an enclosing `if` in the same function
    condition_in_class: str | None = None  # the same test through `self.` attributes
    origin: str | None = None  # a freeze applied elsewhere: where (`at construction, in ...`)
    reapplicable: bool = True  # False: what decides the freeze is not visible where it applies


class ShadowedMethod(NamedTuple):
    """`self.freeze_bn = freeze_bn` in a class that defines `def freeze_bn(self)`."""

    class_name: str
    name: str
    span: Span


@dataclass
class ParamFreeze:
    """`requires_grad = False` / `requires_grad_(False)` on a module's parameters."""

    owner: str  # the module whose parameters are frozen (`m`, `self.bn`)
    is_bn: bool
    span: Span
    after: Statement  # the statement after which the module can be put in eval mode
    function: FunctionInfo | None
    only_bias: bool = False  # `m.bias.requires_grad = False`: the shift alone is pinned
    # the flag written (`train_bn`, `self.train_bn`) when the value is a parameter that is
    # False by default (`def __init__(..., train_bn=False)`) rather than a literal False
    switch: str | None = None


@dataclass
class ModelStep:
    """A step of setting a model up for distributed training: wrap, optimizer, SyncBN."""

    kind: str  # model_wrap | optimizer | sync_convert
    target: str  # the model expression it takes (for an optimizer: whose .parameters())
    assigned: str | None
    call: CallInfo
    statement: Statement
    function: FunctionInfo | None
    text: str  # the statement's source text
    qualname: str = ""  # what the call resolves to (`torch.nn.parallel.DistributedDataParallel`)
    replicas: bool = False  # a wrap that trains one replica per process (DDP, Horovod)
    move: Statement | None = None  # what to move to reorder it (itself, or its lone `if`)
    move_lines: tuple[str, ...] = ()  # that statement's rows, relative to its indentation
    conditions: tuple[Condition, ...] = ()  # the `if` tests it runs under
    through: Origin | None = None  # done inside a first-party helper (of another file)
    fresh: bool = False  # a conversion whose new BN layers get new parameters
    # the calls that build the model it takes (a wrap's model: `DDP(Net().cuda())`, `model`
    # assigned or passed by this file's callers); empty when not known
    builders: tuple[Builder, ...] = ()


class Switch(NamedTuple):
    """A test of one name alone: its truth (`if batch_norm:`) or its comparison with a literal
    (`if norm == "batch":`, `if mode is not None:`)."""

    name: str
    literal: object = None
    equal: bool | None = None  # None: the test is the name's truth
    # `if self.batch_norm:` where `__init__` does `self.batch_norm = batch_norm`: `name` is that
    # parameter of this function (None: a name of the function the test is in)
    function: FunctionInfo | None = None

    def holds(self, value: object) -> bool:
        """Whether the test holds where the name has this value."""
        return bool(value) if self.equal is None else (value == self.literal) == self.equal


class Condition(NamedTuple):
    """An enclosing `if` test: which `if` (an id within the module), its text, and whether
    the step is in its `else` branch."""

    node: int
    text: str
    negated: bool
    uses: frozenset[str] = frozenset()  # names the test depends on, through local assignments
    names_at: tuple[tuple[int, str], ...] = ()  # (offset in `text`, name) of each name it reads
    switch: Switch | None = None  # the test reads one name alone

    def renamed(self, names: dict[str, str]) -> Condition:
        """The test as a caller writes it, each name of `names` replaced by the caller's
        (only the names the test reads: not attributes or strings that look the same)."""
        text, spots, shift = self.text, [], 0
        for at, name in sorted(self.names_at):
            new = names.get(name, name)
            text = text[:at + shift] + new + text[at + shift + len(name):]
            spots.append((at + shift, new))
            shift += len(new) - len(name)
        switch = self.switch
        if switch is not None:
            switch = switch._replace(name=names.get(switch.name, switch.name))
        return Condition(-1, text, self.negated, frozenset(n for _, n in spots), tuple(spots),
                         switch)

    def excludes(self, other: Condition) -> bool:
        """The two cannot both hold: the two branches of one `if`, or tests that contradict
        (`rank == -1` / `rank != -1`, `x` / `not x`) in conjunctions."""
        if self.node == other.node:
            return self.negated != other.negated
        mine, theirs = _facts(self), _facts(other)
        return any((text, not value) in theirs for text, value in mine)


def _facts(condition: Condition) -> set[tuple[str, bool]]:
    """The conjuncts a test asserts, as (normalised text, truth): `a == b` is (`a == b`, True),
    `a != b` is (`a == b`, False), `not x` is (`x`, False); an `else` branch asserts only the
    negation of a single test."""
    parts = [p.strip() for p in condition.text.split(" and ")] if not condition.negated \
        else [condition.text.strip()]
    out = set()
    for part in parts:
        value = not condition.negated
        part = part.strip("() ")
        if part.startswith("not "):
            part, value = part[4:].strip("() "), not value
        if " != " in part:
            part, value = part.replace(" != ", " == ", 1), not value
        out.add((" ".join(part.split()), value))
    return out


@dataclass
class BiasedLayer:
    """A conv / linear / dense layer with an additive bias."""

    framework: str
    call: CallInfo
    bias: Arg | None
    activation: Arg | None
    bias_param: str
    origin: Related | None = None  # a class of another file that is this layer
    functional: bool = False  # applied where it is called (`tf.layers.conv2d(x, ...)`)
    container: str | None = None  # one of the layers held in this container (`self.convs`)


@dataclass
class BiasBeforeBN:
    """A biased layer whose output goes straight into a BatchNorm."""

    layer: BiasedLayer
    bn: BNSite
    how: str  # sequential | nested | consecutive
    unnormalized: Span | None = None  # where the same layer is also used without a BN after it
    # the BN is in an `if` without `else` (`if is_batchnorm: x = BN()(x)`): without it the
    # bias counts, so it is cancelled only where the test always holds
    switched: bool = False


class Builder(NamedTuple):
    """A call that builds what a name holds (`model = Net()`, `model = build()`, `model =
    keras.Model(inputs, x)`), for the rules that need to know which BatchNorm a model holds."""

    span: Span
    function: FunctionInfo | None  # where the call is
    # a functional Keras `Model(inputs, outputs)` in a function: the layers applied there from
    # where `inputs` is made on are its own
    since: Pos | None = None
    local_class: str | None = None  # it constructs this class of the file
    # it builds a library layer or container that holds no BatchNorm unless it is given one
    # (`nn.Linear(...)`, `nn.Sequential(...)`: the catalogue's `bn_free` prefixes)
    bn_free_library: bool = False


@dataclass
class TapeCall:
    """A Keras model called without `training` inside the `tf.GradientTape` of a function that
    applies gradients (a TF2 training step): `logits = model(x)`."""

    call: CallInfo
    receiver: str  # as written: `model`, `self.model`, `self`
    function: FunctionInfo | None
    builders: tuple[Builder, ...]  # what the receiver holds is built by these calls
    owner: str | None  # `self(x)`: the model is an instance of this class of the file
    train_row: int  # where the step applies its gradients
    training_default: bool  # the model's class here defaults `call`'s `training` to True
    positional: int = 1  # arguments passed by position (`model(x, labels)`: 2)
    # the positional parameters of the model class's `call` (this file's class), `self` aside
    signature: tuple[str, ...] | None = None


class LibraryModel(NamedTuple):
    """A library model built in this file that is known to hold plain BatchNorm layers
    (`torchvision.models.resnet50()`, `tf.keras.applications.ResNet50()`): BN the file uses
    without constructing it."""

    qualname: str
    callee: str  # as written
    span: Span
    function: FunctionInfo | None = None
    assigned: str | None = None  # the name the model is assigned to (`backbone = ResNet50()`)

    @property
    def keras(self) -> bool:
        """A Keras application (else a torchvision model)."""
        return self.qualname.split(".", 1)[0] in ("tensorflow", "keras", "tf_keras")


class ApiMention(NamedTuple):
    """A BN API named but not called here (`{'normalizer_fn': slim.batch_norm}`, an
    `arg_scope([slim.batch_norm])` list, a parameter's default): code that breaks where the
    API is gone, like a call of it."""

    api: ApiRef
    written: str  # the qualified name as imported (`tensorflow.contrib.slim.batch_norm`)
    text: str  # as written here (`slim.batch_norm`)
    span: Span
    function: FunctionInfo | None
    alternatives: tuple[tuple[str, ApiRef | None], ...] = ()  # as BNSite's


class DeviceScope(NamedTuple):
    """`with strategy.scope():` for a tf.distribute strategy that trains on several devices:
    what is built inside is replicated, one replica per device."""

    strategy: str  # the strategy as written (`strategy`, `tf.distribute.MirroredStrategy()`)
    span: Span  # the `strategy.scope()` call
    function: FunctionInfo | None
    first_row: int
    last_row: int
    resolved: bool  # the strategy's class is known (else judged by its name)


class Marker(NamedTuple):
    """A construct that says something about how the module runs (TF1 graph mode, ...)."""

    kind: str
    span: Span
    text: str


class Mark(NamedTuple):
    """Something other files' rules may ask about a module: `arg_scope:<api id>` (an arg_scope
    gives a BN API defaults), `loads_weights`, `bias_by_name` (a bias parameter looked up by
    its name), `bias_used` (another module's bias used without a check that it exists),
    `ema_restore`, `registers:<collection>`, `update_ops_unrun` (a train op that
    does not run UPDATE_OPS), `update_ops_read`."""

    kind: str
    span: Span
    path: str | None = None  # None: the module being checked
    function: str | None = None  # qualname of the function it is in

    def where(self) -> str:
        return f"{shown_path(self.path)}:{self.span.start.row}" if self.path else \
            f"line {self.span.start.row}"


@dataclass
class ModuleIR:
    """Everything a source file lifts into."""

    path: str
    bn_sites: list[BNSite] = field(default_factory=list)
    functions: list[FunctionInfo] = field(default_factory=list)
    tower_loops: list[TowerLoop] = field(default_factory=list)
    collection_gets: list[CollectionGet] = field(default_factory=list)
    train_ops: list[TrainOp] = field(default_factory=list)
    ema_applies: list[EmaApply] = field(default_factory=list)
    gradient_sums: list[GradientSum] = field(default_factory=list)
    attribute_sets: list[AttributeSet] = field(default_factory=list)
    graph_mode: list[Marker] = field(default_factory=list)  # TF1 graph-mode constructs
    loss_scaled_per_tower: bool = False  # a loss divided by the tower/clone count somewhere
    legacy_keras: bool = False  # the module selects tf-keras (TF_USE_LEGACY_KERAS)
    arg_scoped: frozenset[str] = frozenset()  # BN API ids that an arg_scope gives defaults to
    model_calls: list[ModelCall] = field(default_factory=list)
    mode_calls: list[ModeCall] = field(default_factory=list)
    freeze_calls: list[FreezeCall] = field(default_factory=list)
    freezing_trains: frozenset[str] = frozenset()  # classes whose train() re-applies a freeze
    freezers: frozenset[str] = frozenset()  # qualnames of the functions that freeze BN
    shadowed_methods: list[ShadowedMethod] = field(default_factory=list)
    param_freezes: list[ParamFreeze] = field(default_factory=list)
    model_steps: list[ModelStep] = field(default_factory=list)
    # functions that replace a model's BN layers by new BN modules and return it (vacancy's
    # `convert_model`, a copy of torch's converter): qualname -> (the module parameter,
    # whether the new layers get new parameters rather than the old ones)
    converters: dict[str, tuple[str, bool]] = field(default_factory=dict)
    device_scopes: list[DeviceScope] = field(default_factory=list)
    bn_models: list[LibraryModel] = field(default_factory=list)
    tape_calls: list[TapeCall] = field(default_factory=list)
    # calls here that build a Keras model of another file whose `call` defaults `training` to
    # True (the project view fills it: BN012)
    training_models: list[Span] = field(default_factory=list)
    # first-party models of other files built here, by the span of the call that builds one:
    # the positional parameters of their class's Keras `call` (BN012 reads `model(x, labels)`)
    call_signatures: dict[Span, tuple[str, ...]] = field(default_factory=dict)
    api_mentions: list[ApiMention] = field(default_factory=list)  # BN APIs named, not called
    training_calls: list[TrainingCall] = field(default_factory=list)
    # the per-process batch of its training data loaders, when known (BN006 weighs it)
    loader_batch: int | None = None
    backends: frozenset[str] = frozenset()  # torch.distributed backends named ("gloo", "nccl")
    import_row: int = 1  # where a new top-level import goes (after the last one)
    bias_before_bn: list[BiasBeforeBN] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # module qualname -> local alias
    names_in_use: frozenset[str] = frozenset()
    tf1_prefix: str | None = None  # how this file spells the TF1 API (`tf`, `tf.compat.v1`)
    tf1_code: bool = False  # TF1 code through and through: tf.contrib, no tf.compat.v1
    removed_by_keras3: str | None = None  # an API it calls that TF 2.16 removed (tf.estimator)
    trains: bool = True  # builds an optimizer, steps one, or calls backward()/fit()/minimize()
    script_without_training: bool = False  # a `__main__` script that never steps an optimizer
    target_explicit: bool = False  # the TensorFlow target comes from configuration or pins
    targets: dict[str, tuple[int, ...]] = field(default_factory=dict)  # framework -> version
    # The project (empty when the file is checked alone): BN built in other files that this
    # module's calls reach, and facts the summaries of other files state about this one.
    reached_sites: list[BNSite] = field(default_factory=list)
    project_notes: list[str] = field(default_factory=list)  # where cross-file analysis gave up
    marks: list[Mark] = field(default_factory=list)  # this module's marks
    # every file's marks by kind, kept raw and shared by all files of the project (a project
    # can hold a thousand; a rule asks for one kind): (file, (row, col, end row, end col),
    # function); those of `project_path` (this file) are left out by `marks_of`
    project_marks: dict[str, list[tuple[str, tuple[int, int, int, int], str | None]]] = field(
        default_factory=dict)
    project_path: str | None = None
    neighbours: frozenset[str] = frozenset()  # files of the modules it calls or that call it
    # facts of code it calls: fact -> (file, (row, col, end row, end col)) of each place (kept
    # raw: a fact can hold a thousand places and a rule asks for one fact; see `reached`)
    reached_facts: dict[str, list[tuple[str, tuple[int, int, int, int]]]] = field(
        default_factory=dict)
    project_apis: dict[str, ApiRef] = field(default_factory=dict)  # BN APIs the project builds
    imported: bool = True  # some other module of the project uses it (False: nothing does)
    script: bool = False  # has a `__main__` guard or module-level statements that run things
    in_package: bool = False  # its folder is a package (`__init__.py`): it is importable API

    def reached(self, fact: str) -> list[Origin]:
        """Where code this module calls states `fact` (other files)."""
        return [Origin(path, Span(Pos(loc[0], loc[1]), Pos(loc[2], loc[3])))
                for path, loc in self.reached_facts.get(fact, ())]

    def marks_of(self, kind: str, *, local: bool = True) -> list[Mark]:
        """The marks of `kind`: this module's (unless `local` is False), then other files'."""
        return list(self._marks(kind, local))

    def has_mark(self, kind: str) -> bool:
        """Whether this module or another file has a mark of `kind` (no list built: a kind
        like `loads_weights` has a place in most files of a model zoo)."""
        return next(self._marks(kind, True), None) is not None

    def _marks(self, kind: str, local: bool) -> Iterator[Mark]:
        if local:
            yield from (m for m in self.marks if m.kind == kind)
        for path, loc, function in self.project_marks.get(kind, ()):
            if path != self.project_path:
                yield Mark(kind, Span(Pos(loc[0], loc[1]), Pos(loc[2], loc[3])), path, function)

    @property
    def dead(self) -> bool:
        """Nothing runs this module: no other module of the project imports it, it is no
        script, and it is not part of an importable package (a stray copy of a file)."""
        return not self.imported and not self.script and not self.in_package

    def tensorflow_target(self) -> tuple[int, ...]:
        """The TensorFlow this code must run on: the configured or pinned version; else TF1
        for code written against TF1 only (tf.contrib, or `tf.Session`-style calls without
        tf.compat.v1); else the current release."""
        if not self.target_explicit and self.tf1_code:
            return (1, 15)
        return self.targets.get("tensorflow", ())

    def all_bn_sites(self) -> list[BNSite]:
        """BN built here and BN built elsewhere by the first-party code this module calls."""
        return [*self.bn_sites, *self.reached_sites]

    def spell(self, qualname: str) -> str | None:
        """`qualname` written with this module's imports (`tensorflow.compat.v1.layers.x` ->
        `tf.compat.v1.layers.x`), using the longest imported prefix; None if none is imported."""
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            local = self.aliases.get(".".join(parts[:cut]))
            if local is not None:
                return ".".join([local, *parts[cut:]])
        return None

    def alias(self, *modules: str) -> str | None:
        """The local name bound to the first of `modules` that is imported."""
        for module in modules:
            if module in self.aliases:
                return self.aliases[module]
        return None

    def fresh_name(self, preferred: str) -> str:
        name, n = preferred, 1
        while name in self.names_in_use:
            n += 1
            name = f"{preferred}_{n}"
        return name


# ---------------------------------------------------------------------------------------------
# What rules return


class Related(NamedTuple):
    """Another place a finding depends on (`path` None: the finding's own file)."""

    path: str | None
    span: Span
    message: str


class Finding(NamedTuple):
    code: str
    span: Span
    message: str
    fix: Fix | None = None
    related: tuple[Related, ...] = ()
