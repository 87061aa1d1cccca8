"""Match-action tables as dicts: what the data plane looks up and the control plane writes.

An entry's action is a tuple ``(action name, param, param, ...)`` with the params as ints in P4Info order,
so the pipeline unpacks it positionally without looking anything up. Exact keys are one int: the match
fields concatenated in P4Info order (``pack_key``), which is also how the pipeline builds a lookup key from
header fields, so a lookup is one dict access. LPM tables keep one dict per prefix length and probe the
lengths present, longest first.

Errors carry the codes BMv2's P4Runtime server gives (see ``errors``): a duplicate entry is
ALREADY_EXISTS, a missing one NOT_FOUND, a full table UNKNOWN (PI reports the target's failure to add).
"""

from __future__ import annotations

from collections.abc import Sequence

from google.rpc import code_pb2

from softswitch.errors import SwitchError

#: ``(action name, *params)``, params as ints in P4Info order.
ActionCall = tuple

#: What P4Runtime stores with an entry and gives back on reads: (controller_metadata, metadata,
#: idle_timeout_ns). Kept apart from the action so the data plane's dicts hold only what it uses.
EntryExtras = tuple[int, bytes, int]


def pack_key(values: Sequence[int], widths: Sequence[int]) -> int:
    """Concatenate exact-match field values (in P4Info order) into one int key."""
    key = 0
    for value, width in zip(values, widths, strict=True):
        key = (key << width) | value
    return key


class Table:
    """What exact and LPM tables share: name, capacity and the default action."""

    def __init__(self, name: str, size: int, initial_default: ActionCall, const_default: bool) -> None:
        self.name = name
        self.size = size
        self.initial_default = initial_default
        self.const_default = const_default
        self.default: ActionCall = initial_default
        self.extras: dict[object, EntryExtras] = {}
        self.default_extras: EntryExtras = (0, b"", 0)

    def set_default(self, action: ActionCall | None, extras: EntryExtras) -> None:
        """MODIFY of the default entry; ``None`` restores the program's initial default (PI's reset)."""
        self.default = self.initial_default if action is None else action
        self.default_extras = (0, b"", 0) if action is None else extras

    def _full(self) -> SwitchError:
        return SwitchError(code_pb2.UNKNOWN, f"table {self.name} is full ({self.size} entries)")

    def _exists(self) -> SwitchError:
        return SwitchError(
            code_pb2.ALREADY_EXISTS, f"{self.name}: match entry exists, use MODIFY to change its action"
        )

    def _missing(self) -> SwitchError:
        return SwitchError(code_pb2.NOT_FOUND, f"{self.name}: cannot find match entry")


class ExactTable(Table):
    """A table whose fields are all exact: ``entries`` maps the packed key to the action."""

    def __init__(
        self, name: str, size: int, widths: Sequence[int], initial_default: ActionCall, const_default: bool
    ) -> None:
        super().__init__(name, size, initial_default, const_default)
        self.widths = tuple(widths)
        self.entries: dict[int, ActionCall] = {}

    def reset(self) -> None:
        self.entries.clear()
        self.extras.clear()
        self.set_default(None, (0, b"", 0))

    def insert(self, key: int, action: ActionCall, extras: EntryExtras) -> None:
        if key in self.entries:
            raise self._exists()
        if len(self.entries) >= self.size:
            raise self._full()
        self.entries[key] = action
        self.extras[key] = extras

    def modify(self, key: int, action: ActionCall, extras: EntryExtras) -> None:
        if key not in self.entries:
            raise self._missing()
        self.entries[key] = action
        self.extras[key] = extras

    def delete(self, key: int) -> None:
        if self.entries.pop(key, None) is None:
            raise self._missing()
        del self.extras[key]

    def get(self, key: int) -> tuple[ActionCall, EntryExtras] | None:
        action = self.entries.get(key)
        return None if action is None else (action, self.extras[key])


class LpmTable(Table):
    """A table with one LPM field. Keys are ``(value, prefix_len)``; the value's host bits are zero
    (P4Runtime requires it and ``entity_store`` checks it)."""

    def __init__(
        self, name: str, size: int, width: int, initial_default: ActionCall, const_default: bool
    ) -> None:
        super().__init__(name, size, initial_default, const_default)
        self.width = width
        self.entries: dict[tuple[int, int], ActionCall] = {}
        self._by_len: dict[int, dict[int, ActionCall]] = {}
        self._lens: list[int] = []  # prefix lengths present, longest first

    def reset(self) -> None:
        self.entries.clear()
        self.extras.clear()
        self._by_len.clear()
        self._lens = []
        self.set_default(None, (0, b"", 0))

    def _mask(self, prefix_len: int) -> int:
        return ((1 << prefix_len) - 1) << (self.width - prefix_len)

    def _store(self, key: tuple[int, int], action: ActionCall, extras: EntryExtras) -> None:
        value, prefix_len = key
        self.entries[key] = action
        self.extras[key] = extras
        self._by_len.setdefault(prefix_len, {})[value] = action
        self._lens = sorted(self._by_len, reverse=True)

    def insert(self, key: tuple[int, int], action: ActionCall, extras: EntryExtras) -> None:
        if key in self.entries:
            raise self._exists()
        if len(self.entries) >= self.size:
            raise self._full()
        self._store(key, action, extras)

    def modify(self, key: tuple[int, int], action: ActionCall, extras: EntryExtras) -> None:
        if key not in self.entries:
            raise self._missing()
        self._store(key, action, extras)

    def delete(self, key: tuple[int, int]) -> None:
        if self.entries.pop(key, None) is None:
            raise self._missing()
        del self.extras[key]
        value, prefix_len = key
        by_value = self._by_len[prefix_len]
        del by_value[value]
        if not by_value:
            del self._by_len[prefix_len]
            self._lens = sorted(self._by_len, reverse=True)

    def get(self, key: tuple[int, int]) -> tuple[ActionCall, EntryExtras] | None:
        action = self.entries.get(key)
        return None if action is None else (action, self.extras[key])

    def lookup(self, value: int) -> ActionCall | None:
        """The action of the longest prefix that matches ``value``, or None on a miss."""
        for prefix_len in self._lens:
            action = self._by_len[prefix_len].get(value & self._mask(prefix_len))
            if action is not None:
                return action
        return None
