/*
 * The slot registers' @atomic block of p4src/v1model/lhc.p4, exactly as softswitch/slots.py models it
 * (that file is the reference; each function here names the method it mirrors): a worker's contribution,
 * the answer to a repeat, and on a leaf of a two-level job its partial going up and its parent's result
 * coming down (docs/switch.md, "Two levels: leaf and spine"). Registers are the Pipeline's numpy arrays.
 */
#include "dataplane.h"

#include <string.h>

/* The uplinks lookup of pipeline.py _lhc_ingress: the job's set_uplink call, or none. */
int read_uplink(Dataplane *e, uint64_t job_id, Uplink *up)
{
    const Layout *L = &e->L;
    memset(up, 0, sizeof(*up));
    PyObject *action = lookup(e->s.uplinks, job_id);
    if (action == NULL && PyErr_Occurred())
        return -1;
    if (action == NULL)
        action = e->s.uplinks_default;
    int hit = is_action(action, e->name_set_uplink);
    if (hit <= 0)
        return hit;
    up->has = 1;
    if (param(action, L->uplink_port_at, L->uplink_len, &up->port) < 0
        || param(action, L->uplink_worker_id_at, 0, &up->worker_id) < 0
        || param(action, L->uplink_src_mac_at, 0, &up->src_mac) < 0
        || param(action, L->uplink_dst_mac_at, 0, &up->dst_mac) < 0
        || param(action, L->uplink_src_addr_at, 0, &up->src_addr) < 0
        || param(action, L->uplink_dst_addr_at, 0, &up->dst_addr) < 0
        || param(action, L->uplink_src_port_at, 0, &up->src_port) < 0
        || param(action, L->uplink_dst_port_at, 0, &up->dst_port) < 0)
        return -1;
    return 0;
}

/* The packet becomes the RESULT, sourced from where it was sent (slots.py _multicast_result). */
static long multicast_result(const Layout *L, uint8_t *rx, uint32_t bitmap, uint8_t byte0)
{
    rx[L->lhc_byte0] = (uint8_t)((L->msg_result << L->type_shift) | (byte0 & L->byte0_keep));
    put_be(rx + L->lhc_bitmap, L->bitmap_bytes, bitmap);
    memcpy(rx + L->eth_src, rx + L->eth_dst, L->mac_bytes);
    memcpy(rx + L->ip_src, rx + L->ip_dst, L->ip_addr_bytes);
    memcpy(rx + L->udp_sport, rx + L->udp_dport, L->udp_port_bytes);
    put16(rx + L->udp_checksum, 0);
    return L->stat_result;
}

/* The packet, its payload the copy's values, becomes a leaf's partial to its parent (slots.py _send_up). */
static long send_up(const Layout *L, uint8_t *rx, const Uplink *up, uint32_t bitmap, long outcome)
{
    put_be(rx + L->lhc_worker_id, L->worker_id_bytes, up->worker_id);
    put_be(rx + L->lhc_bitmap, L->bitmap_bytes, bitmap);
    put_be(rx + L->eth_src, L->mac_bytes, up->src_mac);
    put_be(rx + L->eth_dst, L->mac_bytes, up->dst_mac);
    put_be(rx + L->ip_src, L->ip_addr_bytes, up->src_addr);
    put_be(rx + L->ip_dst, L->ip_addr_bytes, up->dst_addr);
    put_be(rx + L->udp_sport, L->udp_port_bytes, up->src_port);
    put_be(rx + L->udp_dport, L->udp_port_bytes, up->dst_port);
    put16(rx + L->udp_checksum, 0);
    return outcome;
}

/* The copy's values into the packet's payload (slots.py: self._payload[:] = row). */
static void row_to_payload(const Layout *L, const uint32_t *row, uint8_t *payload)
{
    for (long i = 0; i < L->lanes; i++)
        put_be(payload + i * L->lane_bytes, L->lane_bytes, row[i]);
}

/* The @atomic block for DATA (slots.py _aggregate and _retransmit): returns the outcome, -1 never. */
long aggregate(Dataplane *e, uint8_t *rx, Py_ssize_t cell, uint64_t epoch, uint32_t seq, uint32_t step,
                      uint32_t worker_bit, uint64_t fan_in, uint8_t byte0, const Uplink *up)
{
    const Layout *L = &e->L;
    uint16_t *epochs = e->epoch.buf;
    uint32_t *rounds = e->round.buf, *bitmaps = e->bitmap.buf;
    uint8_t *remainings = e->remaining.buf;
    uint32_t *row = (uint32_t *)e->values.buf + cell * L->lanes;
    uint8_t *payload = rx + L->frame_payload;
    uint32_t bitmap = 0;
    uint8_t remaining = 0;
    int starts;
    if (epochs[cell] != epoch) { /* lazy reset of this copy: the packet starts its first round */
        epochs[cell] = (uint16_t)epoch;
        starts = 1;
    } else {
        remaining = remainings[cell];
        uint32_t round = rounds[cell];
        if (seq == round) {
            bitmap = bitmaps[cell];
            if (remaining == 0) { /* a repeat of the finished round: answer the sender */
                row_to_payload(L, row, payload);
                rx[L->lhc_byte0] = (uint8_t)((L->msg_result_retx << L->type_shift) | (byte0 & L->byte0_keep));
                put_be(rx + L->lhc_bitmap, L->bitmap_bytes, bitmap);
                uint8_t swap[8];
                long pairs[3][2] = {{L->eth_dst, L->eth_src}, {L->ip_src, L->ip_dst}, {L->udp_sport, L->udp_dport}};
                long sizes[3] = {L->mac_bytes, L->ip_addr_bytes, L->udp_port_bytes};
                for (int k = 0; k < 3; k++) {
                    memcpy(swap, rx + pairs[k][0], sizes[k]);
                    memcpy(rx + pairs[k][0], rx + pairs[k][1], sizes[k]);
                    memcpy(rx + pairs[k][1], swap, sizes[k]);
                }
                put16(rx + L->udp_checksum, 0);
                return L->stat_retx;
            }
            if (remaining == 1 && up->has) { /* awaiting the parent: the partial goes up again */
                row_to_payload(L, row, payload);
                return send_up(L, rx, up, bitmap, L->stat_up_retx);
            }
            if (bitmap & worker_bit)
                return L->stat_drop_duplicate;
            starts = 0;
        } else if (remaining == 0 && seq == (uint32_t)(round + step)) {
            starts = 1;
        } else {
            return L->stat_drop_stale_round;
        }
    }
    if (starts) { /* first of a round: the packet's words become the value (and stay the payload) */
        for (long i = 0; i < L->lanes; i++)
            row[i] = (uint32_t)get_be(payload + i * L->lane_bytes, L->lane_bytes);
        bitmap = worker_bit;
        remaining = (uint8_t)(fan_in - 1);
        rounds[cell] = seq;
    } else {
        if (((byte0 >> L->op_shift) & L->op_mask) == L->op_add) {
            for (long i = 0; i < L->lanes; i++) /* uint32: wraps mod 2^32 */
                row[i] += (uint32_t)get_be(payload + i * L->lane_bytes, L->lane_bytes);
        } else {
            for (long i = 0; i < L->lanes; i++)
                row[i] |= (uint32_t)get_be(payload + i * L->lane_bytes, L->lane_bytes);
        }
        bitmap |= worker_bit;
        remaining = (uint8_t)(remaining - 1);
        if (remaining == 0 || (remaining == 1 && up->has))
            row_to_payload(L, row, payload);
    }
    bitmaps[cell] = bitmap;
    remainings[cell] = remaining;
    if (remaining == 0) /* the last contribution: the packet becomes the result */
        return multicast_result(L, rx, bitmap, byte0);
    if (remaining == 1 && up->has) /* a leaf's last worker: the partial goes up, once */
        return send_up(L, rx, up, bitmap, L->stat_up);
    return L->stat_absorbed;
}

/* The @atomic block for a result from a leaf's parent (slots.py _store_result): stored, and multicast,
 * only by a copy that awaits exactly this round; nothing is written otherwise. */
long store_result(Dataplane *e, uint8_t *rx, Py_ssize_t cell, uint64_t epoch, uint32_t seq, uint8_t byte0)
{
    const Layout *L = &e->L;
    uint8_t *remainings = e->remaining.buf;
    if (((uint16_t *)e->epoch.buf)[cell] != epoch || ((uint32_t *)e->round.buf)[cell] != seq)
        return L->stat_drop_stale_result;
    if (remainings[cell] == 0)
        return L->stat_drop_duplicate;
    if (remainings[cell] != 1)
        return L->stat_drop_stale_result;
    uint32_t *row = (uint32_t *)e->values.buf + cell * L->lanes;
    uint8_t *payload = rx + L->frame_payload;
    for (long i = 0; i < L->lanes; i++)
        row[i] = (uint32_t)get_be(payload + i * L->lane_bytes, L->lane_bytes);
    uint32_t bitmap = (uint32_t)get_be(rx + L->lhc_bitmap, L->bitmap_bytes);
    ((uint32_t *)e->bitmap.buf)[cell] = bitmap;
    remainings[cell] = 0;
    return multicast_result(L, rx, bitmap, byte0);
}
