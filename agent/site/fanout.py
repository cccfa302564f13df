"""The fan-out: one pass over the log that serves many subscribers
(:class:`Fanout`), each capture row offered only to the readers it can
concern (:class:`Router`), converted once per class of readers that see
it alike.

Rules of this file:
* Pure, as agent.site.selection's readers are: it sees readers, ranges and
  capture rows; the site database and the Spark batch job both feed it.
* The result for each subscriber is what its reader alone selects.
"""

from __future__ import annotations

from itertools import groupby, islice
from operator import itemgetter
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from codec.ops import RUN_ROWS, Operation, Run, Transaction, op_count

from .capture import FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_SCHEMA, KIND_UPDATE
from .errors import InvalidSetting
from .folding import folded_alike, folded_row, make_transaction
from .selection import SubscriberReader
from .view import View

_new = tuple.__new__
_KIND = itemgetter(2)
# Consecutive capture rows of one shape and flags: the rows a plan
# (_hand_rows) takes together, whatever their kinds.
_SHAPE_FLAGS = itemgetter(1, 3)


class _Route(NamedTuple):
    """Where the capture rows of one shape go, among a Router's readers.

    ``classes`` groups the readers that see the shape alike (same columns,
    same SUBSCRIBE BY column and values): a row becomes the same operation
    for each reader of a class, so it is converted once per class.
    ``every`` are the classes offered every row (those that receive every
    row, and those that see the table through several articles, which
    decide themselves: agent.site.union); ``filters`` holds, for each
    SUBSCRIBE BY column (or route) of the table's articles, ``(old_at,
    new_at, by_value)``: ``by_value`` maps a value to the classes whose
    subset holds it, the value at ``old_at`` (and, for an UPDATE,
    ``new_at``) of a capture row.  A table in one publication has one.
    """

    classes: tuple[tuple["View", tuple[int, ...]], ...]
    every: tuple[int, ...]
    filters: tuple[tuple[int, int, dict[object, tuple[int, ...]]], ...]
    plain: bool  # every class's view is a View (not a union of articles)

    def numbers(self, kind: int, row: tuple) -> tuple[int, ...]:
        """The classes an ordinary capture ``row`` of this shape can concern."""
        numbers = self.every
        for old_at, new_at, by_value in self.filters:  # each class sits at one place at most
            old = row[old_at]
            numbers = (*numbers, *by_value.get(old, ()))
            if kind == KIND_UPDATE and row[new_at] != old:  # moved: its new subset's classes too
                moved_to = by_value.get(row[new_at], ())
                if moved_to:
                    numbers = tuple(dict.fromkeys((*numbers, *moved_to)))
        return numbers

class Router:
    """Which of several subscribers' readers a capture row can concern.

    Used where one pass over the log serves many subscribers (the Spark
    batch job, :class:`Fanout` for the agent's own sends): instead of
    offering every row to every reader, a row goes
    to the readers that receive every row of its table, those whose
    SUBSCRIBE BY values hold its old or new value, and, for a row written
    back to its origin, the origin alone.  That is a superset of the readers
    that turn it into an operation; each reader still decides, so the
    result is what each reader alone would select.  The origin of an
    ordinary row is never offered it (no echo).

    Readers that see a shape alike form one class (:class:`_Route`): a
    catalog every subscriber receives is converted once, not once for each.
    """

    def __init__(self, readers: list[SubscriberReader]) -> None:
        self.readers = readers
        self.runs = bool(readers) and readers[0].runs  # a pass serves readers of one form
        self._index = {reader.subscriber: index for index, reader in enumerate(readers)}
        self._routes: dict[int, _Route] = {}
        self._plans: dict[tuple, _Plan] = {}  # (shape, flags) -> how its rows go (_hand_rows)

    def route(self, shape_id: int) -> _Route:
        route = self._routes.get(shape_id)
        if route is not None:
            return route
        members: dict[tuple, list[int]] = {}
        views: dict[tuple, View] = {}
        for index, reader in enumerate(self.readers):
            view = reader.view(shape_id)
            if view is None:
                continue
            members.setdefault(view.alike, []).append(index)
            views.setdefault(view.alike, view)
        classes = tuple((views[alike], tuple(indexes)) for alike, indexes in members.items())
        every = tuple(number for number, (view, _) in enumerate(classes) if view.values is None)
        by_place: dict[tuple[int, int], dict[object, list[int]]] = {}
        for number, (view, _) in enumerate(classes):
            if view.values is not None and view.old_filter is not None:
                by_value = by_place.setdefault((view.old_filter, view.new_filter), {})
                for value in view.values:
                    by_value.setdefault(value, []).append(number)
        route = self._routes[shape_id] = _Route(classes, every, tuple(
            (old_at, new_at, {value: tuple(numbers) for value, numbers in by_value.items()})
            for (old_at, new_at), by_value in by_place.items()), all(type(view) is View for view, _ in classes))
        return route

    def candidates(self, origin: str, row: tuple) -> frozenset[int]:
        """Indexes into ``readers`` of the subscribers ``row`` can concern."""
        return frozenset(index for members in self.classes(origin, row) for index in members)

    def classes(self, origin: str, row: tuple) -> list[tuple[int, ...]]:
        """The readers ``row`` can concern (as :meth:`candidates`), grouped
        into classes whose readers each turn it into the same operation."""
        origin_index = self._index.get(origin)
        flags = row[3]
        if row[2] == KIND_SCHEMA:  # each reader takes what concerns it
            return [tuple(index for index in range(len(self.readers)) if index != origin_index)]
        if flags and flags & FLAG_RETURN_TO_ORIGIN:
            return [] if origin_index is None else [(origin_index,)]
        route = self.route(row[1])
        found = []
        for number in route.numbers(row[2], row):
            members = route.classes[number][1]
            if origin_index in members:  # no echo
                members = tuple(index for index in members if index != origin_index)
            if members:
                found.append(members)
        return found

    def select(self, origin: str, rows: Iterable[tuple], ops: list[list[Operation]]) -> int:
        """Append to ``ops[i]`` the operations consecutive capture ``rows`` of
        one log transaction of ``origin`` become for reader ``i``, as
        ``readers[i].extend`` would; return how many were appended in all.
        A row is converted once for each class of readers it concerns."""
        origin_index = self._index.get(origin)
        added = 0
        owned: dict[int, list] = {}  # a member's joined run's rows (_hand_runs)
        plans = self._plans
        for key, group in groupby(rows, _SHAPE_FLAGS):
            plan = plans.get(key)
            if plan is not None:  # the common case: rows routed one by one, whatever their kinds
                added += _hand_rows(plan, group, origin_index, ops, owned)
                continue
            for kind, same in groupby(group, _KIND):
                plan = plans.get(key)
                if plan is not None:  # made for the rows before
                    added += _hand_rows(plan, same, origin_index, ops, owned)
                else:
                    added += self._select_group((key[0], kind, key[1]), list(same), origin, origin_index, ops,
                                                owned)
        return added

    def _select_group(self, key: tuple, group: list[tuple], origin: str, origin_index: int | None,
                      ops: list[list[Operation]], owned: dict[int, list]) -> int:
        """:meth:`select` of consecutive capture rows of one shape, kind and
        flags (``key``) that have no plan yet: rows written back to their
        origin, a schema change, and rows routed to every class or to
        union views go their own ways; for rows that :func:`_hand_rows`
        serves, the plan is made here, once."""
        added = 0
        shape_id, kind, flags = key
        if flags and flags & FLAG_RETURN_TO_ORIGIN:
            if origin_index is not None:  # written back to its origin: for that reader alone
                before = len(ops[origin_index])
                self.readers[origin_index].extend(origin, group, ops[origin_index])
                added += op_count(islice(ops[origin_index], before, None))
            return added
        if kind == KIND_SCHEMA:  # each reader takes what concerns it (rare: no class, no route)
            for index, reader in enumerate(self.readers):
                if index != origin_index:
                    before = len(ops[index])
                    reader.extend(origin, group, ops[index])
                    added += len(ops[index]) - before
            return added
        if kind != KIND_UPDATE and kind != KIND_INSERT and kind != KIND_DELETE:
            return added
        route = self.route(shape_id)
        if not route.classes:
            return added
        if self.runs and route.filters and route.plain:
            plan = self._plans[shape_id, flags] = _plan(route)
            return _hand_rows(plan, group, origin_index, ops, owned)
        buckets: dict[int, list[tuple]]
        if not route.filters:
            buckets = {number: group for number in route.every}
        else:
            buckets = {}
            numbers_of = route.numbers
            for row in group:
                for number in numbers_of(kind, row):
                    bucket = buckets.get(number)
                    if bucket is None:
                        buckets[number] = [row]
                    else:
                        bucket.append(row)
        for number in sorted(buckets) if len(buckets) > 1 else buckets:
            view, members = route.classes[number]
            if origin_index is not None and origin_index in members:  # no echo
                members = tuple(index for index in members if index != origin_index)
                if not members:
                    continue
            bucket = buckets[number]
            if kind == KIND_UPDATE and self.runs:
                selected = view.update_runs(bucket)
            elif kind == KIND_UPDATE:
                update_op = view.update
                selected = [op for op in map(update_op, bucket) if op is not None]
            elif self.runs:
                # A bucket holds the rows of the class's subset (routed by
                # their value) or every row (no subset): none to leave out.
                selected = view.subset_runs(kind, bucket) if type(view) is View else view.runs(kind, bucket)
            else:
                selected = view.rows(kind, bucket)
            if selected:
                if self.runs:
                    _hand_runs(selected, members, ops, owned)
                else:
                    for index in members:
                        ops[index].extend(selected)
                added += op_count(selected) * len(members)
        return added


class _Plan(NamedTuple):
    """How :func:`_hand_rows` hands over the capture rows of one shape and
    flags whose route sends them to classes of plain views by their values
    (in runs): made once per router, as its route is."""

    # One SUBSCRIBE BY column and no class offered every row (the common
    # case): a row's classes are those of its value (``by_value`` of the
    # value at ``old_at``), or of its old and new ones where an UPDATE moved
    # it (``numbers``, the route's); None: ``numbers`` for every row.
    by_value: dict[object, tuple[int, ...]] | None
    old_at: int
    new_at: int
    numbers: Callable[[int, tuple], tuple[int, ...]]
    # By kind (KIND_INSERT, KIND_UPDATE, KIND_DELETE; no other), for each
    # class: what makes a row's run row (an UPDATE's: its head
    # too, View.update_row), what makes an UPDATE's that its value kept in
    # the subset (View.kept_row), the head of an INSERT's or DELETE's run,
    # the members, and the one member of a class of one (-1: several).
    kinds: dict[int, tuple[tuple[Callable, Callable | None, tuple | None, tuple[int, ...], int], ...]]


def _plan(route: _Route) -> _Plan:
    old_at, new_at, by_value = route.filters[0] if len(route.filters) == 1 and not route.every else (0, 0, None)
    kinds = {}
    for kind in (KIND_INSERT, KIND_UPDATE, KIND_DELETE):
        update = kind == KIND_UPDATE
        kinds[kind] = tuple((view.update_row if update else view.old_row, view.kept_row if update else None,
                             None if update else view.run_heads[kind], members,
                             members[0] if len(members) == 1 else -1)
                            for view, members in route.classes)
    return _Plan(by_value, old_at, new_at, route.numbers, kinds)


def _hand_rows(plan: _Plan, rows: Iterable[tuple], origin_index: int | None, ops: list[list[Operation]],
               owned: dict[int, list]) -> int:
    """:meth:`Router.select` of capture ``rows`` of one shape and flags
    whose route sends them to classes of plain views by their values, in
    runs (``plan``): row by row, each row's run row made once for each
    class it concerns (an INSERT's or DELETE's is in the class's subset: it
    is not looked at again) and joined to each member's runs."""
    added = 0
    by_value, old_at, new_at, numbers_of, kinds = plan
    for row in rows:
        kind = row[2]
        classes = kinds.get(kind)
        if classes is None:
            continue  # no kind of operation: nothing, as Router._select_group does
        update = kind == KIND_UPDATE
        if by_value is None or (update and row[new_at] != row[old_at]):
            numbers = numbers_of(kind, row)
            kept = False
        else:  # its value, unchanged, is in the subset of each class it has
            numbers = by_value.get(row[old_at], ())
            kept = True
        for number in numbers:
            make, make_kept, head, members, single = classes[number]
            if single == origin_index:
                continue  # no echo
            if single < 0 and origin_index is not None and origin_index in members:
                members = tuple(index for index in members if index != origin_index)
                single = members[0] if len(members) == 1 else -1
            if update:
                found = make_kept(row) if kept else make(row)
                if found is None:
                    continue
                head, made = found
            else:
                made = make(row)
            if single >= 0:
                _hand_row(head, made, single, ops[single], owned)
                added += 1
            else:
                _hand_runs([_new(Run, (*head, [made]))], members, ops, owned)
                added += len(members)
    return added


def _hand_runs(selected: list, members: tuple[int, ...], ops: list[list[Operation]],
               owned: dict[int, list]) -> None:
    """Append the runs one class selected to each member's operations, the
    first joined to the run a member's operations end with when both have
    the same head (table, kind and columns) and fit in one run: each
    subscriber's runs are then those codec.ops.to_runs makes of its
    operations, which its packer takes as they are.  The runs of a class are
    shared by its members, and so is a joined run: the members whose
    operations end with the same run get one joined run, made once.  Most
    members of a class end with a run the class handed them, but not all
    the same one (a member that received a row of its own since took the
    class's next run as it was): each such run is joined once, whatever
    order its members come in.  A member's joined run that is its own (its
    rows in ``owned``) is filled further in place."""
    first = selected[0]
    if type(first) is not Run:
        for index in members:
            ops[index].extend(selected)
        return
    table, kind, width, before, after, rows = first
    room = RUN_ROWS - len(rows)
    rest = selected[1:] if len(selected) > 1 else None
    shared_last = shared_joined = None  # the last run joined for a member, and what it became
    # Every run joined so far: id -> (the run, kept alive so its id is not reused, what it became).
    joined_of: dict[int, tuple[Run, Run]] = {}
    for index in members:
        mine = ops[index]
        if not mine:
            mine.extend(selected)
            continue
        last = mine[-1]
        if last is not shared_last:
            # Most members end with a run of another head: table first, as
            # a class's runs are mostly of another table than a member's own.
            if not (type(last) is Run and last[0] == table and last[1] == kind and last[2] == width
                    and last[3] == before and last[4] == after and len(last[5]) <= room):
                mine.extend(selected)
                continue
            known = joined_of.get(id(last))
            if known is not None and known[0] is last:
                shared_last, shared_joined = known
            else:
                joined = owned.get(index)
                if joined is not None and last[5] is joined:
                    joined.extend(rows)
                    if rest:
                        mine.extend(rest)
                    continue
                shared_last = last
                shared_joined = _new(Run, (table, kind, width, before, after, [*last[5], *rows]))
                joined_of[id(last)] = (last, shared_joined)
        mine[-1] = shared_joined
        if rest:
            mine.extend(rest)


def _hand_row(head: tuple, made: tuple, index: int, mine: list, owned: dict[int, list]) -> None:
    """:func:`_hand_runs` of the run of one row ``made`` of ``head`` (a
    run's table, kind and columns) to one member (``index``, its
    operations ``mine``): a run of that head its operations end with is
    filled in place where it is the member's own.  An INSERT of the row
    whose DELETE the member's operations end with folds into it here
    (agent.site.folding), as it would once the transaction is complete."""
    last = mine[-1] if mine else None
    if type(last) is Run:  # not an operation (a row written back) or a schema change
        if (last[1] == head[1] and last[0] == head[0] and last[3] == head[3] and last[4] == head[4]
                and last[2] == head[2]):
            rows = last[5]
            if owned.get(index) is rows:
                if len(rows) < RUN_ROWS:
                    rows.append(made)
                    return
            elif len(rows) < RUN_ROWS:
                rows = owned[index] = [*rows, made]
                mine[-1] = _new(Run, (*head, rows))
                return
        elif (head[1] == KIND_INSERT and last[1] == KIND_DELETE and last[0] == head[0] and last[2] == head[2]
              and last[5][-1][:head[2]] == made[:head[2]]):
            _fold_last(last, head, made, index, mine, owned)
            return
    rows = owned[index] = [made]
    mine.append(_new(Run, head + (rows,)))


def _fold_last(last: Run, head: tuple, made: tuple, index: int, mine: list, owned: dict[int, list]) -> None:
    """Fold the INSERT ``made`` (of ``head``) into the DELETE of its row
    that ends the member's operations (``last``, a run of DELETEs)."""
    table, _kind, width, before, _after, rows = last
    deleted = rows[-1]
    if len(rows) == 1:
        mine.pop()
    elif owned.get(index) is rows:
        rows.pop()
    else:
        rows = owned[index] = rows[:-1]
        mine[-1] = _new(Run, (*last[:5], rows))
    if before == head[4]:  # the same columns (the fan-out's own runs): compared place by place
        folded = folded_alike(table, width, before, deleted, made)
    else:
        folded = folded_row(table, width, dict(zip(before, deleted[width:])), head[4], made)
    if folded is not None:
        _hand_row(folded[:5], folded[5][0], index, mine, owned)


# A pass over the log for several subscribers holds at most this many
# selected operations of one log transaction (all subscribers together)
# before it reads that transaction for each subscriber in turn instead.
FANOUT_HOLD = 50_000

class Fanout:
    """One pass over the log for several subscribers, each with its own range.

    Fed the capture rows of the union of the ranges as :func:`iter_capture`
    gives them (unselected: chunks of one log transaction each, in seq
    order), it offers each row to the readers it can concern
    (:class:`Router`) among the subscribers whose range ``(start, end]``
    holds its log transaction, and returns each subscriber's transactions as
    :func:`read_transactions` makes them, once their log transaction is
    complete.  Pure: it holds the operations selected from the current log
    transaction (``held`` of them), nothing from earlier ones.
    """

    def __init__(self, readers: list[SubscriberReader], ranges: list[tuple[int, int]]) -> None:
        if len(readers) != len(ranges):
            raise InvalidSetting(f"{len(readers)} readers for {len(ranges)} ranges")
        if len({reader.subscriber for reader in readers}) != len(readers):
            raise InvalidSetting("a pass over the log reads for each subscriber at most once")
        self.readers = readers
        self.ranges = ranges
        self.held = 0
        self.active: tuple[int, ...] = ()  # the subscribers whose range holds the current log transaction
        self._ops: list[list[Operation]] = [[] for _ in readers]
        self._commit = 0
        self._origin = ""
        self._routers: dict[tuple[int, ...], Router] = {}

    def add(self, commit: int, origin: str, rows: list[tuple]) -> list[tuple[int, Transaction]]:
        """Take the next chunk of capture rows; return ``(index, transaction)``
        for the log transaction before it, if this chunk starts another."""
        finished: list[tuple[int, Transaction]] = []
        if commit != self._commit:
            finished = self._complete()
            self._commit, self._origin = commit, origin
            self.active = tuple(index for index, (start, end) in enumerate(self.ranges) if start < commit <= end)
            # A subscription change: a reader's plan for this log transaction
            # differs from the last one's, so the routes are made again.
            if [self.readers[index].at(commit) for index in self.active].count(True):
                self._routers.clear()
        active = self.active
        if len(active) == 1:
            # One subscriber: its reader takes the whole chunk (it leaves out
            # its own changes itself), as read_transactions does.
            ops = self._ops[active[0]]
            before = len(ops)
            self.readers[active[0]].extend(origin, rows, ops)
            self.held += op_count(islice(ops, before, None))
        elif active:
            self.held += self._router(active).select(origin, rows, [self._ops[index] for index in active])
        return finished

    def finish(self) -> list[tuple[int, Transaction]]:
        """The end of the input: the transactions of the last log transaction."""
        finished = self._complete()
        self._commit, self.active = 0, ()
        return finished

    def drop(self) -> tuple[int, tuple[int, ...]]:
        """Forget what was selected from the current log transaction; return
        its commit offset and the subscribers whose range holds it, for the
        caller to read it for them another way."""
        dropped = (self._commit, self.active)
        for index in self.active:
            self._ops[index] = []
        self._commit, self.active, self.held = 0, (), 0
        return dropped

    def _complete(self) -> list[tuple[int, Transaction]]:
        finished = []
        for index in self.active:
            ops = self._ops[index]
            if ops:
                self._ops[index] = []
                transaction = make_transaction(self._commit, self._origin, ops)
                if transaction is not None:
                    finished.append((index, transaction))
        self.held = 0
        return finished

    def _router(self, active: tuple[int, ...]) -> Router:
        router = self._routers.get(active)
        if router is None:
            router = self._routers[active] = Router([self.readers[index] for index in active])
        return router


def with_applied(pairs: Iterable[tuple[int, Transaction]], subscribers: Sequence[str],
                 applied_of: Callable[[int], int | None]) -> Iterator[tuple[int, Transaction]]:
    """``pairs`` (index into ``subscribers``, transaction), a transaction
    whose origin is its subscriber (rows written back to it) with its
    ``applied`` (``applied_of(commit)``: what the apply that wrote them
    had applied of that subscriber, docs/message-format.md, version 4).
    Every other transaction, and every other subscriber's, goes as it is."""
    known: tuple[int, int | None] = (0, None)  # the last commit looked up (the pieces of one share it)
    for index, transaction in pairs:
        if transaction.origin == subscribers[index]:
            if known[0] != transaction.commit:
                known = (transaction.commit, applied_of(transaction.commit))
            if known[1] is not None:
                transaction = transaction.with_applied(known[1])
        yield index, transaction
