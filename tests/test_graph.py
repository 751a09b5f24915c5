"""The cone keys of the module graph (bnfix/project/graph.py) against a plain search per module:
the shared, component-wise computation must give every module the digest of exactly the cone
the definition names, on graphs with cycles, self-loops, unsummarised targets and long chains."""

from __future__ import annotations

import random

from bnfix.project.graph import CALLER_LEVELS, cone_keys, digest_of, reverse


def _cone(forward: dict[str, list[str]], callers: dict[str, set[str]], module: str) -> set[str]:
    """The definition, one breadth-first search per module: what it reaches, then callers of
    callers not through what it reaches, then what depends on it directly."""
    cone = {module}
    frontier = {module}
    while frontier:
        frontier = {n for m in frontier for n in forward.get(m, ())} - cone
        cone |= frontier
    frontier = {module}
    for _ in range(CALLER_LEVELS):
        frontier = {n for m in frontier for n in callers.get(m, ())} - cone
        cone |= frontier
    return cone | reverse(forward).get(module, set())


def _random_graph(rng: random.Random, size: int) -> tuple[dict[str, list[str]],
                                                          dict[str, set[str]], dict[str, str]]:
    names = [f"pkg.m{i}" for i in range(size)]
    forward = {}
    for name in names[: size - size // 5]:  # the last fifth are targets with no summary
        forward[name] = sorted(set(rng.sample(names, rng.randint(0, min(4, size)))))
    callers: dict[str, set[str]] = {}
    for name, targets in forward.items():
        for target in targets:
            if rng.random() < 0.5:
                callers.setdefault(target, set()).add(name)
    digests = {name: f"d{rng.randint(0, 3)}" for name in names if rng.random() < 0.9}
    return forward, callers, digests


def test_cone_keys_equal_one_search_per_module_on_random_graphs() -> None:
    rng = random.Random(12)
    for size in (1, 2, 3, 8, 30, 120):
        for _ in range(25):
            forward, callers, digests = _random_graph(rng, size)
            wanted = {m: f"extra-{m}" for m in forward if rng.random() < 0.8}
            keys = cone_keys(forward, callers, digests, wanted)
            assert keys == {m: digest_of(digests, _cone(forward, callers, m), extra)
                            for m, extra in wanted.items()}


def test_cone_of_a_cycle_holds_every_member_and_what_they_reach() -> None:
    forward = {"a": ["b"], "b": ["c", "a"], "c": ["d"], "d": [], "e": ["a"]}
    digests = {m: m.upper() for m in forward}
    keys = cone_keys(forward, {}, digests, {"a": "", "c": "", "e": ""})
    assert keys["a"] == digest_of(digests, {"a", "b", "c", "d", "e"})  # e imports a
    assert keys["c"] == digest_of(digests, {"b", "c", "d"})  # b depends on c directly
    assert keys["e"] == digest_of(digests, {"a", "b", "c", "d", "e"})


def test_cone_keys_change_only_where_a_changed_summary_is_in_the_cone() -> None:
    forward = {"model": ["layers"], "train": ["model"], "layers": [], "tools": []}
    before = cone_keys(forward, {}, {m: "1" for m in forward}, {m: "" for m in forward})
    after = cone_keys(forward, {}, {**{m: "1" for m in forward}, "layers": "2"},
                      {m: "" for m in forward})
    assert {m for m in forward if before[m] != after[m]} == {"model", "train", "layers"}


def test_a_long_import_chain_or_cycle_needs_no_recursion() -> None:
    size = 5000
    forward = {f"m{i:05}": [f"m{i + 1:05}"] if i + 1 < size else [] for i in range(size)}
    forward["m04999"] = ["m00000"]  # and closed into one cycle of 5,000
    keys = cone_keys(forward, {}, {}, {"m00000": "", "m02500": ""})
    everything = digest_of({}, set(forward))
    assert keys == {"m00000": everything, "m02500": everything}
    del forward["m04999"]
    chain = cone_keys(forward, {}, {}, {"m04990": ""})
    assert chain["m04990"] == digest_of({}, {f"m{i:05}" for i in range(4989, 5000)})
