"""The packet replication engine: multicast groups of (egress port, instance) replicas.

BMv2's simple_switch replicates a packet whose ingress set ``mcast_grp`` once per replica of that group;
each copy runs egress with ``egress_port`` and ``egress_rid`` (the replica's instance) set. Group 0 means
"no multicast" and a group that does not exist yields no copies, as in BMv2. Limits and codes follow
p4lang/PI's PRE manager: group ids are 1 .. 2^15 - 1 (higher ids are reserved there: OUT_OF_RANGE).
"""

from __future__ import annotations

from google.rpc import code_pb2

from softswitch.errors import SwitchError, invalid

#: PI reserves group ids from 2^15 on for its own use.
FIRST_RESERVED_GROUP = 1 << 15

#: One copy: (egress port, instance = egress_rid).
Replica = tuple[int, int]


class MulticastGroups:
    """Group id -> replicas, in the order BMv2 emits them (by instance, then port)."""

    def __init__(self) -> None:
        self.groups: dict[int, tuple[Replica, ...]] = {}

    def reset(self) -> None:
        self.groups.clear()

    @staticmethod
    def _check(group_id: int, replicas: list[Replica]) -> tuple[Replica, ...]:
        if group_id == 0:
            raise invalid("0 is not a valid multicast group id")
        if group_id >= FIRST_RESERVED_GROUP:
            raise SwitchError(code_pb2.OUT_OF_RANGE, f"multicast group id {group_id} is too high")
        if len(set(replicas)) != len(replicas):
            raise invalid(f"multicast group {group_id} lists a replica (port, instance) twice")
        return tuple(sorted(replicas, key=lambda r: (r[1], r[0])))

    def insert(self, group_id: int, replicas: list[Replica]) -> None:
        ordered = self._check(group_id, replicas)
        if group_id in self.groups:
            raise SwitchError(code_pb2.ALREADY_EXISTS, f"multicast group {group_id} already exists")
        self.groups[group_id] = ordered

    def modify(self, group_id: int, replicas: list[Replica]) -> None:
        ordered = self._check(group_id, replicas)
        if group_id not in self.groups:
            raise SwitchError(code_pb2.NOT_FOUND, f"multicast group {group_id} does not exist")
        self.groups[group_id] = ordered

    def delete(self, group_id: int) -> None:
        self._check(group_id, [])
        if self.groups.pop(group_id, None) is None:
            raise SwitchError(code_pb2.NOT_FOUND, f"multicast group {group_id} does not exist")
