/*
 * liveness — which ranks still answer, asked outside MPI when a collective
 * hangs (issue 23: a whole host lost mid-run).
 *
 * When a host vanishes (power, kernel, link), its ranks close no connection:
 * the survivors' collective simply never finishes and MPI cannot say who is
 * missing. So every rank keeps a small UDP responder beside MPI: a thread that
 * answers each ping with its rank. comm_mpi.c exchanges every rank's card
 * (host name, pid, node-local rank, the addresses and port of its responder)
 * once at start-up; when a collective times out, the rank pings every peer
 * for a few seconds and names those that never answered. A rank that is alive
 * but stuck still answers (its responder is a thread of its own), so "does
 * not answer" means its process or its host is gone.
 *
 * The responder listens on every address (port chosen by the kernel); a card
 * lists the host's non-loopback IPv4 addresses (127.0.0.1 when it has none),
 * the same ones Open MPI's TCP transport would use between hosts. Pings
 * carry a token that every rank derives from the cards, so a datagram of
 * another job is ignored.
 *
 * Owns: the responder's socket and thread. Never calls MPI.
 */
#ifndef SHARDLM_LIVENESS_H
#define SHARDLM_LIVENESS_H

#include <stdint.h>

#define LIVENESS_MAX_ADDRS 4
#define LIVENESS_HOST_LEN 64

/* What one rank tells the others about itself; the same bytes on every host. */
struct rank_card {
    char host[LIVENESS_HOST_LEN]; /* gethostname(), NUL-terminated */
    int32_t rank, pid;
    int32_t local_rank, local_world; /* on its node (MPI_COMM_TYPE_SHARED) */
    uint32_t addrs[LIVENESS_MAX_ADDRS]; /* IPv4, network byte order */
    int32_t n_addrs;
    uint16_t port;                      /* the responder's UDP port, network byte order */
    uint16_t pad;
};

struct liveness;

/* Starts this rank's responder and fills its card (all but local_rank/world).
 * NULL, with a warning and port 0 on the card, where no UDP socket can be had:
 * the job then runs without (comm_mpi.c drops it on every rank). */
struct liveness *liveness_start(int rank, struct rank_card *card);
/* The cards of all WORLD ranks, indexed by rank (copied). */
void liveness_set_peers(struct liveness *l, const struct rank_card *cards, int world);
/* Pings every other rank for up to SECONDS; answered[r] = 1 for each rank that
 * answered (this rank counts as answering). Returns the number that did not,
 * or -1 when this rank cannot ping (no socket). */
int liveness_probe(struct liveness *l, double seconds, int *answered);
/* Stops the responder and frees L (NULL is fine). */
void liveness_stop(struct liveness *l);

#endif
