/*
 * One frame through p4src/v1model/lhc.p4, exactly as softswitch/pipeline.py models it (that file is the
 * reference; each function here names the method it mirrors). The frame is rewritten in place, like the
 * Python pipeline's receive buffer, and every copy it produces goes to emit_frame.
 *
 * Tables are the Python dicts themselves (ExactTable.entries, LpmTable._by_len, MulticastGroups.groups),
 * looked up with the GIL held under the switch lock (dataplane_tables.c); registers and counters are the
 * Pipeline's numpy arrays through the buffer protocol. Nothing here keeps a copy of either. The @atomic
 * block (the slot registers) is dataplane_slots.c.
 */
#include "dataplane.h"

#include <string.h>

/* Parser outcome: the deepest header extracted (pipeline.py's _NONE .. _PAYLOAD_VALID). */
enum { LEVEL_NONE, LEVEL_ETHERNET, LEVEL_IPV4, LEVEL_UDP, LEVEL_LHC, LEVEL_PAYLOAD };

/* LhcParser: the deepest header extracted; *error when the parser hit the end (PacketTooShort). */
static int parse(const Layout *L, const uint8_t *rx, Py_ssize_t length, int *error)
{
    *error = 0;
    if (length < L->ethernet_bytes)
        return *error = 1, LEVEL_NONE;
    if (get16(rx + L->eth_type) != (uint64_t)L->ethertype_ipv4)
        return LEVEL_ETHERNET;
    if (length < L->frame_ipv4 + 1) /* lookahead<bit<8>> past the end */
        return *error = 1, LEVEL_ETHERNET;
    if (rx[L->frame_ipv4] != L->ipv4_version_ihl)
        return LEVEL_ETHERNET;
    if (length < L->frame_udp)
        return *error = 1, LEVEL_ETHERNET;
    if ((get16(rx + L->ip_frag) & L->frag_offset_mask) || rx[L->ip_proto] != L->ip_proto_udp)
        return LEVEL_IPV4;
    if (length < L->frame_lhc)
        return *error = 1, LEVEL_IPV4;
    if ((get16(rx + L->udp_dport) & L->udp_port_mask) != (uint64_t)L->udp_port_base)
        return LEVEL_UDP;
    if (length < L->frame_payload)
        return *error = 1, LEVEL_UDP;
    if (length < L->frame_end)
        return *error = 1, LEVEL_LHC;
    return LEVEL_PAYLOAD;
}

/* LhcEgress + LhcComputeChecksum + LhcDeparser (pipeline.py _egress). */
static int egress(Dataplane *e, uint8_t *rx, long port, uint64_t rid, int is_lhc, Py_ssize_t length, Sink *sink)
{
    const Layout *L = &e->L;
    if (port == L->drop_port)
        return 0;
    if (is_lhc && (rx[L->lhc_byte0] >> L->type_shift) == L->msg_result) {
        uint64_t key = (get_be(rx + L->lhc_job_id, L->job_id_bytes) << L->replicas_job_shift) | rid;
        PyObject *action = lookup(e->s.replicas, key);
        if (action == NULL && PyErr_Occurred())
            return -1;
        if (action == NULL)
            action = e->s.replicas_default;
        int hit = is_action(action, e->name_set_replica_dst);
        if (hit <= 0)
            return hit;
        uint64_t mac, addr, udp_port;
        if (param(action, L->replica_dst_mac_at, L->replica_len, &mac) < 0
            || param(action, L->replica_dst_addr_at, 0, &addr) < 0
            || param(action, L->replica_dst_port_at, 0, &udp_port) < 0)
            return -1;
        put_be(rx + L->eth_dst, L->mac_bytes, mac);
        put_be(rx + L->ip_dst, L->ip_addr_bytes, addr);
        put_be(rx + L->udp_dport, L->udp_port_bytes, udp_port);
    }
    if (get16(rx + L->eth_type) == (uint64_t)L->ethertype_ipv4 && rx[L->frame_ipv4] == L->ipv4_version_ihl
        && length >= L->frame_udp)
        ipv4_checksum(L, rx);
    return emit_frame(e, sink, port, rx, length);
}

/* simple_switch's PRE (pipeline.py _replicate): one egress pass per replica; group 0 means egress_spec 0. */
static int replicate(Dataplane *e, uint8_t *rx, uint64_t group_id, Py_ssize_t length, Sink *sink)
{
    if (group_id == 0)
        return egress(e, rx, 0, 0, 1, length, sink);
    PyObject *group = lookup(e->s.groups, group_id);
    if (group == NULL)
        return PyErr_Occurred() ? -1 : 0; /* a group that does not exist yields no copies */
    if (!PyTuple_Check(group)) {
        PyErr_SetString(PyExc_TypeError, "a multicast group is not a tuple of (port, instance)");
        return -1;
    }
    Py_INCREF(group);
    int status = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(group) && status == 0; i++) {
        uint64_t port, rid;
        PyObject *replica = PyTuple_GET_ITEM(group, i);
        if (!PyTuple_Check(replica) || param(replica, 0, 2, &port) < 0 || param(replica, 1, 2, &rid) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a replica is not a (port, instance) tuple");
            status = -1;
        } else {
            status = egress(e, rx, (long)port, rid, 1, length, sink);
        }
    }
    Py_DECREF(group);
    return status;
}

/* LhcIngress, the is_lhc branch (pipeline.py _lhc_ingress): steps 1-8, the counter, the fate. */
static int lhc_ingress(Dataplane *e, uint8_t *rx, Py_ssize_t length, long ingress_port, int level, int error,
                       Sink *sink)
{
    const Layout *L = &e->L;
    uint64_t job_index = 0, job_id = 0, mcast_grp = 0;
    Uplink up = {0};
    long stat;
    if (error || level != LEVEL_PAYLOAD) {
        stat = L->stat_drop_malformed;
    } else {
        uint8_t byte0 = rx[L->lhc_byte0];
        uint64_t worker_id = get_be(rx + L->lhc_worker_id, L->worker_id_bytes);
        uint64_t slot = get_be(rx + L->lhc_slot, L->slot_bytes), epoch = get_be(rx + L->lhc_epoch, L->epoch_bytes);
        uint32_t seq = (uint32_t)get_be(rx + L->lhc_seq, L->seq_bytes);
        job_id = get_be(rx + L->lhc_job_id, L->job_id_bytes);
        long msg_type = byte0 >> L->type_shift;
        int well_formed = get16(rx + L->udp_len) == (uint64_t)L->udp_length
                          && get16(rx + L->ip_total_len) == (uint64_t)L->ipv4_total_length
                          && !((byte0 >> L->flags_shift) & L->flags_mask);
        int from_parent = 0;
        if (well_formed) {
            if (read_uplink(e, job_id, &up) < 0)
                return -1;
            /* a result is taken only by a leaf, only from its parent: address, UDP port, switch port */
            from_parent = up.has && (msg_type == L->msg_result || msg_type == L->msg_result_retx)
                          && get_be(rx + L->ip_src, L->ip_addr_bytes) == up.dst_addr
                          && get16(rx + L->udp_sport) == up.dst_port && (uint64_t)ingress_port == up.port;
        }
        if (!well_formed) {
            stat = L->stat_drop_malformed;
        } else if (msg_type != L->msg_data && !from_parent) {
            stat = L->stat_drop_bad_type;
        } else if (((byte0 >> L->op_shift) & L->op_mask) > L->op_or) {
            stat = L->stat_drop_bad_op;
        } else {
            PyObject *job = lookup(e->s.jobs, job_id);
            if (job == NULL && PyErr_Occurred())
                return -1;
            if (job == NULL) { /* miss: the default action (unknown_job) runs */
                int set_job = is_action(e->s.jobs_default, e->name_set_job);
                if (set_job < 0 || (set_job && param(e->s.jobs_default, L->job_index_at, 0, &job_index) < 0))
                    return -1;
                stat = L->stat_drop_unknown_job;
            } else {
                uint64_t slot_base, slot_count, fan_in, job_epoch;
                if (param(job, L->job_index_at, L->set_job_len, &job_index) < 0
                    || param(job, L->slot_base_at, 0, &slot_base) < 0 || param(job, L->slot_count_at, 0, &slot_count) < 0
                    || param(job, L->fan_in_at, 0, &fan_in) < 0 || param(job, L->mcast_grp_at, 0, &mcast_grp) < 0
                    || param(job, L->epoch_at, 0, &job_epoch) < 0)
                    return -1;
                if (epoch != job_epoch) {
                    stat = L->stat_drop_stale_epoch;
                } else if (slot >= slot_count || slot_base + slot >= (uint64_t)e->max_slots) {
                    stat = L->stat_drop_slot_range;
                } else if (from_parent) {
                    Py_ssize_t cell = (Py_ssize_t)((slot_base + slot) * L->slot_copies
                                                   + ((byte0 >> L->ver_shift) & L->ver_mask));
                    stat = store_result(e, rx, cell, epoch, seq, byte0);
                } else {
                    unsigned __int128 key = ((unsigned __int128)job_id << L->workers_job_shift)
                        | ((unsigned __int128)worker_id << L->workers_worker_shift)
                        | ((unsigned __int128)get_be(rx + L->ip_src, L->ip_addr_bytes) << L->workers_src_shift)
                        | ((unsigned __int128)get16(rx + L->udp_sport) << L->workers_sport_shift)
                        | (unsigned __int128)ingress_port;
                    PyObject *worker = lookup_wide(e->s.workers, key);
                    if (worker == NULL && PyErr_Occurred())
                        return -1;
                    if (worker == NULL) {
                        stat = L->stat_drop_bad_worker;
                    } else {
                        uint64_t worker_bit = 0;
                        int admit = is_action(worker, e->name_admit_worker);
                        if (admit < 0 || (admit && param(worker, L->worker_bit_at, 0, &worker_bit) < 0))
                            return -1;
                        Py_ssize_t cell = (Py_ssize_t)((slot_base + slot) * L->slot_copies
                                                       + ((byte0 >> L->ver_shift) & L->ver_mask));
                        stat = aggregate(e, rx, cell, epoch, seq, (uint32_t)(slot_count << 1),
                                         (uint32_t)worker_bit, fan_in, byte0, &up);
                    }
                }
            }
        }
    }
    uint64_t index = job_index * L->num_stats + stat;
    if (index < (uint64_t)e->stat_cells) { /* an index past the counter counts nothing */
        ((uint64_t *)e->stat_packets.buf)[index] += 1;
        ((uint64_t *)e->stat_bytes.buf)[index] += (uint64_t)length;
    }
    if (stat == L->stat_result)
        return replicate(e, rx, mcast_grp, length, sink);
    if (stat == L->stat_retx)
        return egress(e, rx, ingress_port, 0, 1, length, sink);
    if (stat == L->stat_up || stat == L->stat_up_retx)
        return egress(e, rx, (long)up.port, 0, 1, length, sink);
    return 0;
}

/* LhcIngress, the other branches (pipeline.py _forward_ingress): ipv4_routes or l2_forward. */
static int forward_ingress(Dataplane *e, uint8_t *rx, Py_ssize_t length, int level, Sink *sink)
{
    const Layout *L = &e->L;
    uint64_t port;
    PyObject *action;
    if (level >= LEVEL_IPV4) {
        uint8_t ttl = rx[L->ip_ttl];
        if (ttl <= 1)
            return 0;
        action = lpm_lookup(e, get_be(rx + L->ip_dst, L->ip_addr_bytes));
        if (action == NULL && PyErr_Occurred())
            return -1;
        if (action == NULL)
            action = e->s.lpm_default;
        int route = is_action(action, e->name_route);
        if (route <= 0)
            return route;
        uint64_t src_mac, dst_mac;
        if (param(action, L->route_port_at, L->route_len, &port) < 0
            || param(action, L->route_src_mac_at, 0, &src_mac) < 0 || param(action, L->route_dst_mac_at, 0, &dst_mac) < 0)
            return -1;
        put_be(rx + L->eth_dst, L->mac_bytes, dst_mac);
        put_be(rx + L->eth_src, L->mac_bytes, src_mac);
        rx[L->ip_ttl] = (uint8_t)(ttl - 1);
    } else {
        action = lookup(e->s.l2, get_be(rx + L->eth_dst, L->mac_bytes));
        if (action == NULL && PyErr_Occurred())
            return -1;
        if (action == NULL)
            action = e->s.l2_default;
        int set_port = is_action(action, e->name_set_port);
        if (set_port <= 0)
            return set_port;
        if (param(action, L->set_port_at, 0, &port) < 0)
            return -1;
    }
    return egress(e, rx, (long)port, 0, 0, length, sink);
}

/* V1Switch (pipeline.py process). */
int process_frame(Dataplane *e, uint8_t *rx, Py_ssize_t length, long ingress_port, Sink *sink)
{
    const Layout *L = &e->L;
    if (!e->s.configured) /* BMv2 without a program forwards nothing */
        return 0;
    int error;
    int level = parse(L, rx, length, &error);
    if (level >= LEVEL_UDP && (get16(rx + L->udp_dport) & L->udp_port_mask) == (uint64_t)L->udp_port_base)
        return lhc_ingress(e, rx, length, ingress_port, level, error, sink);
    if (!error)
        return forward_ingress(e, rx, length, level, sink);
    return 0;
}
