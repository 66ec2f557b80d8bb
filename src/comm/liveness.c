/*
 * liveness: a UDP responder per rank and the probe that asks every peer
 * (see liveness.h for why it exists).
 */
#include "liveness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"

#define LIVENESS_MAGIC 0x534c4956u /* "SLIV" */
/* How often the responder looks at its stop flag, and how often the probe
 * pings the peers that have not answered yet. */
#define RESPONDER_POLL_MS 200
#define PROBE_ROUND_SECONDS 0.25

enum { MSG_PING = 1, MSG_PONG = 2 };

struct liveness_msg {
    uint32_t magic;
    uint32_t type;
    uint64_t token;
    int32_t rank; /* the sender's */
};

struct liveness {
    int fd;
    int rank;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    _Atomic uint64_t token; /* 0 until the cards are known: pings are ignored */
    struct rank_card *cards;
    int world;
};

static void *responder_main(void *arg)
{
    struct liveness *l = arg;
    while (!atomic_load(&l->stop)) {
        struct pollfd p = {.fd = l->fd, .events = POLLIN};
        if (poll(&p, 1, RESPONDER_POLL_MS) <= 0)
            continue;
        struct liveness_msg msg;
        struct sockaddr_in from;
        socklen_t from_len = sizeof from;
        ssize_t n = recvfrom(l->fd, &msg, sizeof msg, 0, (struct sockaddr *)&from, &from_len);
        uint64_t token = atomic_load(&l->token);
        if (n != (ssize_t)sizeof msg || msg.magic != LIVENESS_MAGIC || msg.type != MSG_PING || !token ||
            msg.token != token)
            continue;
        struct liveness_msg reply = {.magic = LIVENESS_MAGIC, .type = MSG_PONG, .token = token, .rank = l->rank};
        (void)sendto(l->fd, &reply, sizeof reply, 0, (struct sockaddr *)&from, from_len);
    }
    return NULL;
}

/* This host's non-loopback IPv4 addresses that are up; 127.0.0.1 if none. */
static void host_addresses(struct rank_card *card)
{
    struct ifaddrs *list = NULL;
    card->n_addrs = 0;
    if (getifaddrs(&list) == 0) {
        for (struct ifaddrs *i = list; i && card->n_addrs < LIVENESS_MAX_ADDRS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (i->ifa_flags & IFF_LOOPBACK))
                continue;
            card->addrs[card->n_addrs++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        }
        freeifaddrs(list);
    }
    if (card->n_addrs == 0)
        card->addrs[card->n_addrs++] = htonl(INADDR_LOOPBACK);
}

/* A UDP socket bound to a port of the kernel's choice on every address;
 * -1 with errno set when there is none to be had. */
static int udp_socket(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t len = sizeof any;
    if (bind(fd, (struct sockaddr *)&any, sizeof any) != 0 || getsockname(fd, (struct sockaddr *)&any, &len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *port = any.sin_port;
    return fd;
}

struct liveness *liveness_start(int rank, struct rank_card *card)
{
    memset(card, 0, sizeof *card);
    if (gethostname(card->host, sizeof card->host - 1) != 0)
        strcpy(card->host, "?");
    card->rank = rank;
    card->pid = (int32_t)getpid();
    host_addresses(card);
    struct liveness *l = xcalloc(1, sizeof *l);
    l->rank = rank;
    l->fd = udp_socket(&card->port);
    if (l->fd < 0 || pthread_create(&l->thread, NULL, responder_main, l) != 0) {
        log_warn("liveness: no UDP responder (%s): a collective that times out will not name the lost ranks",
                 strerror(errno));
        if (l->fd >= 0)
            close(l->fd);
        free(l);
        card->port = 0;
        return NULL;
    }
    l->thread_started = 1;
    return l;
}

/* FNV-1a over every card: the same on every rank of this job, different for another job. */
static uint64_t job_token(const struct rank_card *cards, int world)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)cards;
    for (size_t i = 0; i < (size_t)world * sizeof *cards; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

void liveness_set_peers(struct liveness *l, const struct rank_card *cards, int world)
{
    l->cards = xmalloc((size_t)world * sizeof *cards);
    memcpy(l->cards, cards, (size_t)world * sizeof *cards);
    l->world = world;
    atomic_store(&l->token, job_token(cards, world));
}

static void ping(int fd, const struct rank_card *card, uint64_t token, int rank)
{
    struct liveness_msg msg = {.magic = LIVENESS_MAGIC, .type = MSG_PING, .token = token, .rank = rank};
    for (int a = 0; a < card->n_addrs; a++) {
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = card->port, .sin_addr.s_addr = card->addrs[a]};
        (void)sendto(fd, &msg, sizeof msg, 0, (struct sockaddr *)&to, sizeof to);
    }
}

int liveness_probe(struct liveness *l, double seconds, int *answered)
{
    uint16_t port;
    int fd = udp_socket(&port);
    if (fd < 0)
        return -1;
    uint64_t token = atomic_load(&l->token);
    int missing = 0;
    for (int r = 0; r < l->world; r++) {
        answered[r] = r == l->rank;
        missing += !answered[r];
    }
    double deadline = now_seconds() + seconds;
    while (missing && now_seconds() < deadline) {
        for (int r = 0; r < l->world; r++)
            if (!answered[r])
                ping(fd, &l->cards[r], token, l->rank);
        double round_end = now_seconds() + PROBE_ROUND_SECONDS;
        for (double now = now_seconds(); missing && now < round_end; now = now_seconds()) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, (int)((round_end - now) * 1000) + 1) <= 0)
                continue;
            struct liveness_msg msg;
            if (recv(fd, &msg, sizeof msg, 0) != (ssize_t)sizeof msg || msg.magic != LIVENESS_MAGIC ||
                msg.type != MSG_PONG || msg.token != token || msg.rank < 0 || msg.rank >= l->world)
                continue;
            if (!answered[msg.rank]) {
                answered[msg.rank] = 1;
                missing--;
            }
        }
    }
    close(fd);
    return missing;
}

void liveness_stop(struct liveness *l)
{
    if (!l)
        return;
    atomic_store(&l->stop, 1);
    if (l->thread_started)
        pthread_join(l->thread, NULL);
    close(l->fd);
    free(l->cards);
    free(l);
}
