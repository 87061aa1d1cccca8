/*
 * A preloaded shim (LD_PRELOAD) that makes the kernel refuse chosen datagrams, for the socket-error tests
 * (tests/harness/socket_faults.py builds and loads it). The fault is in the datagram's IPv4 destination,
 * so that every sender (the native and the Python data planes, udp_batch.c and sendto) meets the same:
 *
 *   127.254.0.E  the send fails with errno E, nothing is sent (EINVAL, ENOBUFS, ENXIO, ...: one datagram's);
 *   127.254.1.E  the same, and every later send on that socket fails with E too (a fault of the socket's
 *                own, such as EBADF, stays), until the descriptor is closed.
 *
 * Any other destination is sent as it is. The destination is the message's address, or on an AF_PACKET
 * socket the IPv4 header's of the frame. sendmmsg sends the messages before the first refused one (and
 * fails with its errno if it is the first), as the kernel does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAULT_NET 0x7FFE /* 127.254/16 */
#define MAX_FD 65536
#define ETH_TYPE_AT 12
#define IP_DST_AT 30 /* Ethernet (14) + the IPv4 header's destination (16) */

static int sticky[MAX_FD];

static int is_packet_socket(int fd)
{
    int domain = 0;
    socklen_t size = sizeof(domain);
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 && domain == AF_PACKET;
}

/* The errno a datagram to IPv4 address `address` (network order) fails with, 0 when it leaves. */
static int fault_for(int fd, uint32_t address)
{
    uint32_t host = ntohl(address);
    if (host >> 16 != FAULT_NET)
        return 0;
    int error = (int)(host & 0xFF);
    if (((host >> 8) & 0xFF) == 1 && fd >= 0 && fd < MAX_FD)
        sticky[fd] = error;
    return error;
}

static int fault_of_frame(int fd, const void *frame, size_t length)
{
    const uint8_t *bytes = frame;
    if (length < IP_DST_AT + 4 || bytes[ETH_TYPE_AT] != 0x08 || bytes[ETH_TYPE_AT + 1] != 0x00)
        return 0;
    uint32_t address;
    memcpy(&address, bytes + IP_DST_AT, 4);
    return fault_for(fd, address);
}

static int fault_of(int fd, const struct sockaddr *to, socklen_t size, const void *data, size_t length)
{
    if (fd >= 0 && fd < MAX_FD && sticky[fd])
        return sticky[fd];
    if (to != NULL && size >= sizeof(struct sockaddr_in) && to->sa_family == AF_INET)
        return fault_for(fd, ((const struct sockaddr_in *)to)->sin_addr.s_addr);
    if (to == NULL && is_packet_socket(fd))
        return fault_of_frame(fd, data, length);
    return 0;
}

static int fault_of_message(int fd, const struct msghdr *m)
{
    const void *data = m->msg_iovlen ? m->msg_iov[0].iov_base : NULL;
    size_t length = m->msg_iovlen ? m->msg_iov[0].iov_len : 0;
    return fault_of(fd, m->msg_name, m->msg_namelen, data, length);
}

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int sendmmsg(int fd, struct mmsghdr *messages, unsigned int n, int flags)
{
    unsigned int clean = 0;
    int error = 0;
    while (clean < n && (error = fault_of_message(fd, &messages[clean].msg_hdr)) == 0)
        clean++;
    if (clean == 0 && n > 0) {
        errno = error;
        return -1;
    }
    return REAL(sendmmsg)(fd, messages, clean, flags);
}

ssize_t sendmsg(int fd, const struct msghdr *message, int flags)
{
    int error = fault_of_message(fd, message);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL(sendmsg)(fd, message, flags);
}

ssize_t sendto(int fd, const void *data, size_t length, int flags, const struct sockaddr *to, socklen_t size)
{
    int error = fault_of(fd, to, size, data, length);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL(sendto)(fd, data, length, flags, to, size);
}

ssize_t send(int fd, const void *data, size_t length, int flags)
{
    int error = fault_of(fd, NULL, 0, data, length);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL(send)(fd, data, length, flags);
}

int close(int fd)
{
    if (fd >= 0 && fd < MAX_FD)
        sticky[fd] = 0;
    return REAL(close)(fd);
}
