"""The import graph of fieldsync's packages (agent, codec, transports,
contrib): no cycle between modules, and no module imports a layer above its
own.

The graph is grimp's: every ``import`` statement counts, at module level,
inside a function or under ``if TYPE_CHECKING:`` alike, so a cycle hidden
behind a lazy import is still a cycle.  Imports by name at run time
(importlib: the transport registry's built-ins, the Spark job the engine
submits) are not seen.

The layers, top to bottom; a module may import its own layer and the layers
below it, never one above (docs/protocol.md, "Layers"):

1. the command line: ``agent.cli``;
2. tools over whole agents: ``agent.chaos`` (the fault-injection suite) and
   ``agent.metrics``;
3. the runner (``agent.runner``), which alone carries out what the hops
   hand back;
4. the hops (``agent.receiving`` with ``agent.resuming``,
   ``agent.applying`` with ``agent.inbound``, ``agent.sending`` with ``agent.preparing``,
   ``agent.delivering``) and the narrow contexts the runner gives them
   (``agent.contexts``): no hop imports the runner;
5. what the runner drives: a pair's persisted state (``agent.pairs``,
   ``agent.peers``, ``agent.pair_files``) and which pairs a batch run
   builds (``agent.working_set``), the queues it opens (``agent.queues``), its
   transports, options, schedules, quarantine, restore marker, left
   files, administration and crash points;
6. the engines behind them: the recovery-log spool (``agent.spool``),
   the Spark batch path (``agent.spark``, and the job in ``contrib``) and
   the packing workers (``agent.pack_workers``, ``agent.pack_processes``);
7. the agent's core: the sans-I/O protocol (``agent.protocol``,
   ``agent.controls``, ``agent.pair_values``), packing sends
   (``agent.outbound``), key files, and the queue interface (``agent.queue_interface``) that the
   spool implements;
8. the agent's error tree (``agent.errors``), which words every package's
   errors;
9. the site database (``agent.site``) and the transports (``transports``),
   which do not import each other;
10. the codec (``codec``): messages, names, keys, the file-system rules
    every layer shares (``codec.fsutil``) and the cyclic collector's pause
    for the passes that make millions of objects (``codec.collector``);
11. the package roots ``agent`` and ``contrib`` themselves (a version
    string), which import nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import grimp
import pytest

PACKAGES = ("agent", "codec", "transports", "contrib")


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # each with its submodules
    independent: bool = False  # its modules may not import each other


LAYERS = (
    Layer("the command line", ("agent.cli",)),
    Layer("tools over whole agents", ("agent.chaos", "agent.metrics")),
    Layer("the runner", ("agent.runner",)),
    Layer("the hops and their contexts", ("agent.receiving", "agent.resuming", "agent.applying", "agent.inbound",
                                          "agent.sending", "agent.preparing", "agent.delivering", "agent.contexts")),
    Layer("what the runner drives", ("agent.pairs", "agent.peers", "agent.pair_files", "agent.working_set", "agent.queues", "agent.run_options",
                                     "agent.transport_options", "agent.transport_pool", "agent.schedule", "agent.quarantine", "agent.restore",
                                     "agent.left_files", "agent.admin", "agent.crashpoints", "agent.signals")),
    Layer("the engines", ("agent.spool", "agent.spark", "agent.pack_workers", "agent.pack_processes",
                              "contrib.spark")),
    Layer("the agent's core", ("agent.protocol", "agent.controls", "agent.pair_values", "agent.outbound",
                               "agent.keyfiles", "agent.queue_interface")),
    Layer("the error tree", ("agent.errors",)),
    Layer("the site database and the transports", ("agent.site", "transports"), independent=True),
    Layer("the codec", ("codec",)),
    Layer("the package roots", ("agent", "contrib")),
)

# Cycles tolerated while work under way removes them, each named with the
# work that does: this list only ever shrinks, and is empty now (issue 31
# removed the last two: the hops importing the runner, and the fleet file
# and `agent remote`).  A cycle not inside an entry fails the test; an entry
# whose cycle is gone fails it too, until it is removed here.
KNOWN_CYCLES: dict[str, frozenset[str]] = {}


def layer_of(module: str, layers: tuple[Layer, ...] = LAYERS) -> tuple[int, str] | None:
    """The index of ``module``'s layer (0 at the top) and the listed module
    it falls under (the longest that is it or a package holding it); a
    package root is only itself."""
    best: tuple[int, str] | None = None
    for index, layer in enumerate(layers):
        for listed in layer.modules:
            if module == listed or (module.startswith(listed + ".") and listed not in ("agent", "contrib")):
                if best is None or len(listed) > len(best[1]):
                    best = (index, listed)
    return best


def upward_imports(graph: grimp.ImportGraph, layers: tuple[Layer, ...] = LAYERS) -> list[str]:
    """Every import from a lower layer into a higher one, or between two
    modules of an independent layer, with the line that makes it."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            low, high = layer_of(importer, layers), layer_of(imported, layers)
            if low is None or high is None:
                continue  # reported by test_every_module_has_a_layer
            upward = high[0] < low[0]
            crossing = high[0] == low[0] and layers[low[0]].independent and high[1] != low[1]
            if upward or crossing:
                found.append(f"{importer} ({layers[low[0]].name}) imports {imported} ({layers[high[0]].name}): "
                             + _lines(graph, importer, imported))
    return found


def module_cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's
    algorithm, iterative): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.find_modules_directly_imported_by(successor)))))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        components.append(frozenset(component))
    return components


def _lines(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return "; ".join(f"line {detail['line_number']}: {detail['line_contents']}" for detail in details)


def _describe(graph: grimp.ImportGraph, component: frozenset[str]) -> str:
    edges = [f"  {importer} -> {imported} ({_lines(graph, importer, imported)})"
             for importer in sorted(component)
             for imported in sorted(graph.find_modules_directly_imported_by(importer)) if imported in component]
    return "\n".join(edges)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_import_cycle_but_the_known_ones(graph) -> None:
    new = [component for component in module_cycles(graph)
           if not any(component <= known for known in KNOWN_CYCLES.values())]
    assert not new, "import cycles (a lazy or TYPE_CHECKING import counts too):\n" + "\n\n".join(
        _describe(graph, component) for component in new)


def test_every_known_cycle_still_exists(graph) -> None:
    """So the allow-list shrinks as the cycles go."""
    cycles = module_cycles(graph)
    gone = [name for name, known in KNOWN_CYCLES.items() if not any(len(component & known) > 1 for component in cycles)]
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES in {__file__}: {gone}"


def test_no_import_from_a_lower_layer_to_a_higher_one(graph) -> None:
    found = upward_imports(graph)
    assert not found, "imports against the layers (see this file's docstring):\n" + "\n".join(found)


def test_every_module_has_a_layer(graph) -> None:
    homeless = sorted(module for module in graph.modules if layer_of(module) is None)
    assert not homeless, f"place these modules in a layer of LAYERS in {__file__}: {homeless}"


def test_no_module_is_in_two_layers() -> None:
    listed = [module for layer in LAYERS for module in layer.modules]
    assert len(listed) == len(set(listed))


# -- the checks themselves ---------------------------------------------------------


def _graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    made = grimp.ImportGraph()
    for importer, imported in imports:
        made.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    return made


def test_the_checks_find_a_cycle_an_upward_import_and_a_crossing() -> None:
    layers = (Layer("top", ("p.top",)), Layer("middle", ("p.left", "p.right"), independent=True),
              Layer("bottom", ("p.bottom",)))
    made = _graph(("p.top", "p.left.a"), ("p.left.a", "p.left.b"), ("p.left.b", "p.left.a"),
                  ("p.bottom", "p.top"), ("p.left.a", "p.right"))
    assert module_cycles(made) == [frozenset({"p.left.a", "p.left.b"})]
    assert [line.split(":")[0] for line in upward_imports(made, layers)] == [
        "p.bottom (bottom) imports p.top (top)", "p.left.a (middle) imports p.right (middle)"]
    assert module_cycles(_graph(("a", "b"), ("b", "c"))) == []
