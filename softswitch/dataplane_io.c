/*
 * Ports of the native data plane: a burst in with one recvmmsg, copies queued per port, a batch out per
 * port with one sendmmsg. The semantics are softswitch/ports.py's (UdpPort, RawPort), batched:
 *
 * - UDP: a datagram is wrapped in the port's synthesized Ethernet/IPv4/UDP headers (the template that
 *   UdpPort built, with the source address, lengths and IPv4 checksum filled in); a frame leaving is sent
 *   as the bytes after its UDP header to its (ipv4.dst, udp.dst). Non-IPv4/UDP frames cannot leave.
 * - Raw (AF_PACKET): frames as they are; PACKET_OUTGOING frames (our own output) are skipped.
 *
 * Sends and receives go through lhc_ina/udp_batch.c, the one batched-UDP layer: a UDP port's queue leaves
 * as UDP GSO runs per destination where the kernel takes them; a datagram the kernel refuses (on a UDP or
 * a raw port alike: EINVAL for an address the socket may not send to, ENXIO for an interface gone) is
 * lost and counted under its errno, and the rest of the queue still leaves; only an errno of the socket's
 * own (udp_batch.h's UDP_FATAL_ERRORS) raises, from flush(), after every port's queue was tried.
 */
#define _GNU_SOURCE
#include "dataplane.h"

#include <errno.h>
#include <linux/if_packet.h>
#include <netinet/in.h>
#include <string.h>

/* Copies wait in one arena until the flush; twice the largest frame, so one always fits after a flush. */
#define ARENA_FRAMES 2
/* One port's queue: what one sendmmsg takes. */
#define QUEUE_CAPACITY UDP_MAX_PER_CALL

int io_setup(Dataplane *e)
{
    const Layout *L = &e->L;
    e->queue_capacity = QUEUE_CAPACITY;
    e->arena_size = ARENA_FRAMES * L->rx_bytes + QUEUE_CAPACITY * L->frame_end;
    e->rx = PyMem_Calloc((size_t)L->burst, (size_t)L->rx_bytes);
    e->rx_messages = PyMem_Calloc((size_t)L->burst, sizeof(struct mmsghdr));
    e->rx_iov = PyMem_Calloc((size_t)L->burst, sizeof(struct iovec));
    e->rx_sources = PyMem_Calloc((size_t)L->burst, sizeof(struct sockaddr_storage));
    e->arena = PyMem_Malloc((size_t)e->arena_size);
    e->port_index = PyMem_Malloc((size_t)(L->max_port + 1) * sizeof(int16_t));
    if (!e->rx || !e->rx_messages || !e->rx_iov || !e->rx_sources || !e->arena || !e->port_index) {
        PyErr_NoMemory();
        return -1;
    }
    for (long i = 0; i <= L->max_port; i++)
        e->port_index[i] = -1;
    if (udp_runs_init(&e->runs, (int32_t)QUEUE_CAPACITY, 0) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void io_free(Dataplane *e)
{
    for (Py_ssize_t i = 0; i < e->n_ports; i++) {
        PyMem_Free(e->ports[i].template);
        PyMem_Free(e->ports[i].iov);
        PyMem_Free(e->ports[i].destinations);
    }
    PyMem_Free(e->ports);
    PyMem_Free(e->rx);
    PyMem_Free(e->rx_messages);
    PyMem_Free(e->rx_iov);
    PyMem_Free(e->rx_sources);
    PyMem_Free(e->arena);
    PyMem_Free(e->port_index);
    udp_runs_free(&e->runs);
}

int port_attach(Dataplane *e, int number, int fd, int kind, const uint8_t *template)
{
    const Layout *L = &e->L;
    if (number < 0 || number > L->max_port || e->port_index[number] >= 0) {
        PyErr_Format(PyExc_ValueError, "port %d is out of range or attached already", number);
        return -1;
    }
    Port *ports = PyMem_Realloc(e->ports, (size_t)(e->n_ports + 1) * sizeof(Port));
    if (ports == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    e->ports = ports;
    Port *p = &ports[e->n_ports];
    memset(p, 0, sizeof(*p));
    p->number = number;
    p->fd = fd;
    p->kind = kind;
    UdpLimits limits = {.segments_max = (int)L->udp_gso_segments, .refusals_max = (int)L->udp_gso_refusals,
                        .bytes_max = L->udp_gso_bytes};
    udp_sender_init(&p->sender, &limits, kind == PORT_UDP);
    p->iov = PyMem_Calloc((size_t)e->queue_capacity, sizeof(struct iovec));
    p->destinations = PyMem_Calloc((size_t)e->queue_capacity, sizeof(struct sockaddr_in));
    p->template = PyMem_Malloc((size_t)L->frame_lhc);
    if (!p->iov || !p->destinations || !p->template) {
        PyMem_Free(p->iov); PyMem_Free(p->destinations); PyMem_Free(p->template);
        PyErr_NoMemory();
        return -1;
    }
    if (template != NULL)
        memcpy(p->template, template, (size_t)L->frame_lhc);
    e->port_index[number] = (int16_t)e->n_ports++;
    return 0;
}

/* Send one port's queue: UDP as runs per destination, raw frames one message each; the errno when the
 * socket itself is unusable, else 0 (refused datagrams are counted in the port's sender). */
static int flush_port(Dataplane *e, Port *p)
{
    const struct sockaddr_in *to = p->kind == PORT_UDP ? p->destinations : NULL;
    int32_t messages = udp_runs_build(&e->runs, p->iov, to, 1, (int32_t)p->queued, &p->sender);
    p->queued = 0;
    return udp_runs_send(&e->runs, p->fd, messages, &p->sender);
}

/* Send every port's queue (the GIL released: the kernel's work lets the P4Runtime threads run). Python
 * twin: DataPlane._flush_ports (softswitch/receive_loop.py). */
int flush_all(Dataplane *e)
{
    int error = 0, first_error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < e->n_ports; i++) {
        Port *p = &e->ports[i];
        error = p->queued ? flush_port(e, p) : 0;
        if (error && !first_error)
            first_error = error;
    }
    Py_END_ALLOW_THREADS
    e->arena_used = 0;
    return first_error;
}

/* Python twin: DataPlane._burst_python's and DataPlane.emit's records (softswitch/receive_loop.py). */
int capture_frame(Dataplane *e, long direction, long port, const uint8_t *frame, Py_ssize_t length)
{
    PyObject *item = Py_BuildValue("(lly#)", direction, port, (const char *)frame, length);
    int status = item ? PyList_Append(e->capture, item) : -1;
    Py_XDECREF(item);
    return status;
}

/* A copy leaving the pipeline: into the inject list, or queued on its port (dropped if none). Python twin:
 * DataPlane.emit and UdpPort.send / RawPort.send. */
int emit_frame(Dataplane *e, Sink *sink, long port, const uint8_t *frame, Py_ssize_t length)
{
    const Layout *L = &e->L;
    if (sink->list != NULL) {
        PyObject *item = Py_BuildValue("(ly#)", port, (const char *)frame, length);
        int status = item ? PyList_Append(sink->list, item) : -1;
        Py_XDECREF(item);
        return status;
    }
    if (port < 0 || port > L->max_port || e->port_index[port] < 0)
        return 0; /* a port with nothing attached drops, as on BMv2 */
    Port *p = &e->ports[e->port_index[port]];
    const uint8_t *data = frame;
    Py_ssize_t size = length;
    if (p->kind == PORT_UDP) {
        if (length < L->frame_lhc || get_be(frame + L->eth_type, 2) != (uint64_t)L->ethertype_ipv4
            || frame[L->frame_ipv4] != L->ipv4_version_ihl || frame[L->ip_proto] != L->ip_proto_udp) {
            p->dropped_non_udp++; /* UDP ports carry only UDP */
            return 0;
        }
        data = frame + L->frame_lhc;
        size = length - L->frame_lhc;
    }
    if (e->capture != NULL && capture_frame(e, e->capture_out, port, frame, length) < 0)
        return -1;
    if (p->queued == e->queue_capacity || e->arena_used + size > e->arena_size) {
        /* a socket's error here is the port's, not this frame's: it is kept for flush() to raise, and
           the frame (and its other replicas) still go on */
        int error = flush_all(e);
        if (error && !e->pending_error)
            e->pending_error = error;
    }
    uint8_t *copy = e->arena + e->arena_used;
    memcpy(copy, data, (size_t)size);
    e->arena_used += size;
    Py_ssize_t q = p->queued++;
    p->iov[q].iov_base = copy;
    p->iov[q].iov_len = (size_t)size;
    if (p->kind == PORT_UDP) {
        struct sockaddr_in *to = &p->destinations[q];
        memset(to, 0, sizeof(*to));
        to->sin_family = AF_INET;
        memcpy(&to->sin_addr, frame + L->ip_dst, (size_t)L->ip_addr_bytes);
        memcpy(&to->sin_port, frame + L->udp_dport, (size_t)L->udp_port_bytes);
    }
    return 0;
}

/* The frame of a UDP datagram received at slot `frame`: UdpPort.receive's headers around it. */
static Py_ssize_t synthesize(const Layout *L, const Port *p, uint8_t *frame, Py_ssize_t size,
                             const struct sockaddr_in *source)
{
    memcpy(frame, p->template, (size_t)L->frame_lhc);
    /* the source MAC is 02:00 then the IPv4 address: its last ip_addr_bytes bytes */
    memcpy(frame + L->eth_src + L->mac_bytes - L->ip_addr_bytes, &source->sin_addr, (size_t)L->ip_addr_bytes);
    memcpy(frame + L->ip_src, &source->sin_addr, (size_t)L->ip_addr_bytes);
    memcpy(frame + L->udp_sport, &source->sin_port, (size_t)L->udp_port_bytes);
    put_be(frame + L->ip_total_len, 2, (uint64_t)(L->ipv4_bytes + L->udp_bytes + size));
    put_be(frame + L->udp_len, 2, (uint64_t)(L->udp_bytes + size));
    ipv4_checksum(L, frame);
    return L->frame_lhc + size;
}

/* Up to `burst` frames from a port into the rx slots, frame i's length in rx_messages[i].msg_len (0 for
 * a frame to skip). Returns the count, or -1 with *error = errno. */
Py_ssize_t burst_receive(Dataplane *e, Port *port, int *error)
{
    const Layout *L = &e->L;
    long offset = port->kind == PORT_UDP ? L->frame_lhc : 0; /* UDP: room for the synthesized headers */
    for (long i = 0; i < L->burst; i++) {
        e->rx_iov[i].iov_base = e->rx + i * L->rx_bytes + offset;
        e->rx_iov[i].iov_len = (size_t)(L->rx_bytes - offset);
        struct msghdr *header = &e->rx_messages[i].msg_hdr;
        memset(header, 0, sizeof(*header));
        header->msg_name = &e->rx_sources[i];
        header->msg_namelen = sizeof(struct sockaddr_storage);
        header->msg_iov = &e->rx_iov[i];
        header->msg_iovlen = 1;
    }
    int received;
    Py_BEGIN_ALLOW_THREADS
    received = udp_receive(port->fd, e->rx_messages, (unsigned int)L->burst, error);
    Py_END_ALLOW_THREADS
    if (received < 0)
        return -1;
    for (int i = 0; i < received; i++) {
        uint8_t *frame = e->rx + i * L->rx_bytes;
        Py_ssize_t size = e->rx_messages[i].msg_len;
        if (port->kind == PORT_UDP) {
            e->rx_messages[i].msg_len = (unsigned int)synthesize(
                L, port, frame, size, (const struct sockaddr_in *)&e->rx_sources[i]);
        } else if (((struct sockaddr_ll *)&e->rx_sources[i])->sll_pkttype == PACKET_OUTGOING) {
            e->rx_messages[i].msg_len = 0; /* what the host sent on the interface, our output included */
        }
    }
    return received;
}
